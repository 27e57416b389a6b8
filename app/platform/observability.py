"""Logging and Sentry set-up, shared by every process (web, worker, scheduler, CLI)."""

from __future__ import annotations

import logging
import os

from app.platform import config

_sentry_started = False


def setup_logging() -> None:
    level = os.environ.get("LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def init_sentry(component: str) -> bool:
    """Initialise Sentry when SENTRY_DSN is set. Workers must call this before creating the broker."""
    global _sentry_started
    settings = config.get()
    if not settings.sentry_dsn or _sentry_started:
        return _sentry_started
    import sentry_sdk  # slow to import with its integrations: only when SENTRY_DSN is set
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration
    from sentry_sdk.integrations.starlette import StarletteIntegration

    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.env,
        server_name=component,
        integrations=[StarletteIntegration(), DramatiqIntegration()],
        traces_sample_rate=float(os.environ.get("SENTRY_TRACES_SAMPLE_RATE", "0")),
    )
    _sentry_started = True
    return True
