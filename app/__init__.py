"""Digest-first notification service: config, db, web app, API, pages, providers, scheduler, CLI."""
