"""A brand-new database for tests that change the schema itself (migrations, partitions dropped
by retention): import the fixture into the test module."""
from __future__ import annotations

import uuid

import psycopg2
import pytest


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
