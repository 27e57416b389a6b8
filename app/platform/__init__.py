"""The platform: what any service of this kind needs, knowing nothing of digests or newsletters.

Settings (config, `.env`); the database (db, migrate, partitions, partitioned_index, retention,
lease, groupcommit); the queue; HTTP (http, forwarded, slow_clients, validation, openapi: route
declarations and the OpenAPI document); API keys, link tokens, addresses, time zones, URLs; mail
building (mail, mail_layout, greeting, css_inline, mustache) and the providers (providers/); the
emergency stop (mail_stop); metrics, logging and Sentry (observability), memory, host, shutdown.
It imports nothing above it (tests/checks/test_layout.py). Every module: docs/layout.md.
"""
