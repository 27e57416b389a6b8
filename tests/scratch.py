"""A brand-new database for tests that change the schema itself (migrations, partitions dropped
by retention), a private folder of migration files, and a lock holder the migrator's first retry
releases: import the fixtures into the test module."""

from __future__ import annotations

import contextlib
import logging
import uuid

import psycopg2
import pytest

from app.platform import migrate


@pytest.fixture
def scratch_url(direct_database_url):
    """The URL of an empty database on Postgres itself (also in the PgBouncer pass, as
    MIGRATION_DATABASE_URL would be), dropped afterwards."""
    base = direct_database_url.rsplit("/", 1)[0]
    name = f"notify_scratch_{uuid.uuid4().hex[:8]}"
    yield f"{base}/{name}"
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def migrations_dir(tmp_path, monkeypatch):
    """Point the runner at a private folder of migration files."""
    real_discover = migrate.discover
    monkeypatch.setattr(migrate, "discover", lambda directory=tmp_path: real_discover(directory))
    return tmp_path


class _OnFirstLockRetry(logging.Handler):
    def __init__(self, action):
        super().__init__()
        self.action, self.fired = action, False

    def emit(self, record):
        if not self.fired and "lock not granted" in record.getMessage():
            self.fired = True
            self.action()


@contextlib.contextmanager
def released_on_first_lock_retry(holder):
    """While inside, `holder`'s open transaction (holding a lock the migrator wants) ends the
    moment the migrator reports its first lock timeout: the retry path is taken every time,
    without timers. Yields the handler: `.fired` says whether it happened."""
    handler = _OnFirstLockRetry(holder.commit)
    logger = logging.getLogger("app.platform.migrate")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        if not handler.fired:
            holder.rollback()
