"""The platform: configuration, database, queue, HTTP, tokens, metrics, migrations, mail building and providers. Imports nothing above it."""
