"""The platform: configuration, database, queue, HTTP, tokens, metrics, migrations, mail building and
providers. It imports nothing above it (tests/test_layout.py)."""
