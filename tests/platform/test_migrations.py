"""Migration runner: applies from empty, re-runs harmlessly, repairs INVALID indexes, retries locks."""

from __future__ import annotations

import threading
import uuid

import psycopg2
import pytest

from app.cli import main as cli_main
from app.platform import config, db, migrate
from tests.conftest import THROUGH_PGBOUNCER
from tests.scratch import migrations_dir, released_on_first_lock_retry  # noqa: F401 - fixture


@pytest.fixture
def scratch_url(direct_database_url):
    """A brand-new empty database, dropped afterwards. Its URL is Postgres itself even in the
    PgBouncer pass: the migrator's session matters (MIGRATION_DATABASE_URL)."""
    base = direct_database_url.rsplit("/", 1)[0]
    name = f"notify_mig_{uuid.uuid4().hex[:8]}"
    url = f"{base}/{name}"
    yield url
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def tables(url) -> set[str]:
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        found = {r[0] for r in cur.fetchall()}
    conn.close()
    return found


def test_applies_from_empty_and_is_rerunnable(scratch_url):
    applied = migrate.migrate(scratch_url)
    assert applied == [m.version for m in migrate.discover()]
    assert set(db.ALL_TABLES) | {"schema_migrations"} <= tables(scratch_url)
    assert migrate.migrate(scratch_url) == []
    rows = migrate.status(scratch_url)
    assert all(r["state"] == "applied" and r["duration_ms"] is not None for r in rows)


def test_double_send_constraints_exist(scratch_url):
    migrate.migrate(scratch_url)
    conn = psycopg2.connect(scratch_url)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint WHERE contype IN ('u', 'p')"
        )
        uniques = {(t, d) for t, d in cur.fetchall()}
        # The partitioned event tables keep their dedup keys in key tables, claimed by a trigger
        # on every insert (migration 0520; tests/platform/test_partitions.py proves the behaviour).
        cur.execute("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal AND tgparentid = 0")
        triggers = set(cur.fetchall())
    conn.close()
    assert ("digest_runs", "UNIQUE (subscriber_id, cadence, period, slot)") in uniques
    assert ("email_log", "UNIQUE (newsletter_id, subscriber_id)") in uniques
    assert ("webhook_event_keys", "PRIMARY KEY (sg_event_id)") in uniques
    assert ("webhook_events", "webhook_events_claim_key") in triggers
    assert ("email_links", "UNIQUE (mail_kind, mail_id, url_hash)") in uniques
    assert ("digest_event_keys", "PRIMARY KEY (source, producer_id)") in uniques
    assert ("digest_events", "digest_events_claim_key") in triggers


def test_two_migrators_at_once_apply_each_file_once(scratch_url):
    migrate.ensure_database(scratch_url)
    errors = []

    def run():
        try:
            migrate.migrate(scratch_url)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    conn = psycopg2.connect(scratch_url)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM schema_migrations")
        assert cur.fetchone()[0] == len(migrate.discover())
    conn.close()


def _write(tmp_path, name, sql):
    (tmp_path / name).write_text(sql)


def test_invalid_index_from_failed_concurrent_build_is_rebuilt(scratch_url, migrations_dir):
    _write(
        migrations_dir,
        "0001_t.sql",
        "CREATE TABLE t (id int PRIMARY KEY, v int);\nINSERT INTO t VALUES (1, 7), (2, 7);",
    )
    _write(
        migrations_dir,
        "0002_idx.sql",
        "-- migrate: no-transaction\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_v_idx ON t (v);",
    )
    with pytest.raises(psycopg2.errors.UniqueViolation):
        migrate.migrate(scratch_url)
    conn = psycopg2.connect(scratch_url)
    conn.autocommit = True
    assert migrate.invalid_indexes(conn) == ["t_v_idx"]  # what a failed concurrent build leaves
    assert [r["state"] for r in migrate.status(scratch_url)] == ["applied", "pending"]
    with conn.cursor() as cur:
        cur.execute("UPDATE t SET v = 8 WHERE id = 2")  # the operator fixes the data
    assert migrate.migrate(scratch_url) == ["0002"]
    assert migrate.invalid_indexes(conn) == []
    with conn.cursor() as cur:
        cur.execute("SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = 't_v_idx'::regclass")
        assert cur.fetchone() == (True, True)
    conn.close()


def test_concurrent_build_that_hit_the_lock_timeout_is_rebuilt_on_retry(scratch_url, migrations_dir, settings):
    """CREATE INDEX CONCURRENTLY waits for the writers already in the table; when that wait hits
    lock_timeout it leaves an INVALID index behind. The retry must rebuild it, not let
    IF NOT EXISTS skip over it and record the migration with the index unusable."""
    settings(migration_lock_timeout="100ms", migration_retries=20)
    _write(migrations_dir, "0001_t.sql", "CREATE TABLE t (id int PRIMARY KEY, v int);")
    migrate.migrate(scratch_url)
    _write(
        migrations_dir,
        "0002_idx.sql",
        "-- migrate: no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS t_v_idx ON t (v);",
    )
    writer = psycopg2.connect(scratch_url)
    writer.cursor().execute("INSERT INTO t VALUES (1, 1)")  # a write still open when the build starts
    with released_on_first_lock_retry(writer) as released:
        assert migrate.migrate(scratch_url) == ["0002"]
    assert released.fired
    writer.close()
    conn = psycopg2.connect(scratch_url)
    with conn.cursor() as cur:
        cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = 't_v_idx'::regclass")
        assert cur.fetchone() == (True,)
        cur.execute("SELECT count(*) FROM t")
        assert cur.fetchone() == (1,)
    conn.close()


@pytest.mark.parametrize("header", ["", "-- migrate: no-transaction\n"])
def test_lock_timeout_is_retried_until_the_lock_frees(scratch_url, migrations_dir, settings, caplog, header):
    settings(migration_lock_timeout="100ms", migration_retries=20)
    _write(migrations_dir, "0001_t.sql", "CREATE TABLE t (id int PRIMARY KEY);")
    _write(migrations_dir, "0002_alter.sql", header + "ALTER TABLE t ADD COLUMN v int;")
    migrate.ensure_database(scratch_url)
    assert migrate.migrate(scratch_url) == ["0001", "0002"]
    # Re-create the situation: a long transaction holds a lock ALTER TABLE must wait for.
    with psycopg2.connect(scratch_url) as setup, setup.cursor() as cur:
        cur.execute("DELETE FROM schema_migrations WHERE version = '0002'")
        cur.execute("ALTER TABLE t DROP COLUMN IF EXISTS v")
    reader = psycopg2.connect(scratch_url)
    with reader.cursor() as cur:
        cur.execute("SELECT * FROM t")  # holds ACCESS SHARE until commit
    releaser = threading.Timer(1.0, reader.commit)
    releaser.start()
    with caplog.at_level("WARNING", logger="app.platform.migrate"):
        assert migrate.migrate(scratch_url) == ["0002"]
    releaser.join()
    reader.close()
    assert "lock not granted" in caplog.text  # it backed off and retried instead of queueing


def test_migrate_and_status_use_the_migration_database_url(scratch_url, settings, capsys):
    settings(migration_database_url=scratch_url)  # DATABASE_URL stays the test database
    assert cli_main(["migrate"]) == 0
    assert set(db.ALL_TABLES) <= tables(scratch_url)
    assert all(r["state"] == "applied" for r in migrate.status())
    assert migrate.target_url("postgresql://elsewhere/x") == "postgresql://elsewhere/x"  # an explicit URL wins
    settings(migration_database_url="")
    assert migrate.target_url() == config.get().database_url


@pytest.mark.skipif(not THROUGH_PGBOUNCER, reason="needs the PgBouncer pass (make test): a transaction-pooling proxy")
def test_through_a_transaction_pooler_the_migrator_stops_with_a_clear_error(scratch_url, monkeypatch):
    """The mistake MIGRATION_DATABASE_URL exists for: migrating through PgBouncer in transaction
    mode. Right after the migrator took its lock, another client takes the server connection it
    ran on (PgBouncer lends the most recently used one), so its next transaction runs in another
    session — without its lock. It must stop, say why, and apply nothing."""
    migrate.ensure_database(scratch_url)
    pooled = config.get().database_url.rsplit("/", 1)[0] + "/" + scratch_url.rsplit("/", 1)[1]
    other = psycopg2.connect(pooled)
    real_take = migrate._take_migrator_lock

    def take_then_lose_the_session(conn):
        pid = real_take(conn)
        with other.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")  # an open transaction keeps that server connection
            assert cur.fetchone()[0] == pid
        return pid

    monkeypatch.setattr(migrate, "_take_migrator_lock", take_then_lose_the_session)
    try:
        with pytest.raises(migrate.MigrationError, match="MIGRATION_DATABASE_URL"):
            migrate.migrate(pooled)
    finally:
        other.close()
    conn = psycopg2.connect(scratch_url)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM schema_migrations")
        assert cur.fetchone()[0] == 0
    conn.close()


def test_bad_file_name_is_a_clear_error(tmp_path):
    _write(tmp_path, "1_bad.sql", "SELECT 1;")
    with pytest.raises(migrate.MigrationError, match=r"NNNN_lower_snake\.sql"):
        migrate.discover(tmp_path)


def test_cli_status_lists_applied_and_pending(capsys):
    assert cli_main(["migrate", "--status"]) == 0
    out = capsys.readouterr().out
    assert "0001  schema" in out and "applied" in out and "0 pending" in out
