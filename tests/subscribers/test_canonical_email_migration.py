"""Migrations 0600-0602 on rows written the old way (lower(email) as the identity): the canonical
address is backfilled in committed batches while writers go on, colliding suppressions merge, the
constraint and the index end valid; and the runner's `-- migrate: python` step they rely on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg2
import psycopg2.errors
import pytest

from app.cli import main as cli_main
from app.platform import migrate
from app.platform.addresses import canonical
from app.subscribers import rekey
from scripts.bench.partition_migration import migrate_until
from tests.scratch import scratch_url  # noqa: F401 - fixture

pytestmark = pytest.mark.not_pooled("a scratch database of its own, straight on Postgres, as migrations run")

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def connect(url):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def rows(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def old_rows(conn, n_more: int) -> None:
    """What the application stored before 0600: suppressions lower-cased, nothing canonical."""
    rows(
        conn,
        "INSERT INTO subscribers (user_id, email) VALUES ('ana', 'Ana@Bücher.example'), "
        "('bo', 'ＢＯ@Example.com'), ('cy', 'Cy@Example.com'), ('dee', %s)",
        ("dee@" + "ü" * 70 + ".com",),
    )
    rows(
        conn,
        "INSERT INTO subscribers (user_id, email) SELECT 'n' || g, 'N' || g || '@Example.test' "
        "FROM generate_series(1, %s) g",
        (n_more,),
    )
    suppressions = [
        ("ana@xn--bcher-kva.example", "spamreport", "sendgrid:spamreport", T0),  # the earliest
        ("ana@bücher.example", "bounce", "sendgrid:bounce", T0 + timedelta(days=1)),
        ("ａｎａ@bücher.example", "unsubscribe", None, T0 + timedelta(days=2)),  # lower('ＡＮＡ…')
        ("ｂｏ@example.com", "erased", "erasure", T0 + timedelta(days=3)),
        ("bo@example.com", "bounce", "sendgrid:bounce", T0 + timedelta(days=1)),  # earlier than erased
        ("cy@example.com", "manual", None, T0),
    ]
    for s in suppressions:
        rows(conn, "INSERT INTO suppressions (email, reason, source, created_at) VALUES (%s, %s, %s, %s)", s)
    rows(
        conn,
        "INSERT INTO webhook_events (sg_event_id, event, email, payload) VALUES "
        "('sg-1', 'open', 'ANA@BÜCHER.EXAMPLE', '{}'), ('sg-2', 'open', NULL, '{}'), "
        "('sg-3', 'open', 'Cy@Example.com', '{}')",
    )


def test_migration_keys_old_rows_merges_suppressions_and_ends_valid(scratch_url, tmp_path, monkeypatch):
    migrate_until(scratch_url, "0599")
    conn = connect(scratch_url)
    old_rows(conn, 2500)
    ids = dict(rows(conn, "SELECT email, id FROM suppressions"))
    monkeypatch.setattr(rekey, "BATCH", 1000)
    progress = []
    real_batch = migrate.batch

    def watched(migrator, work, what, retry_on=()):
        result = real_batch(migrator, work, what, retry_on)
        if what != "rekey":
            return result
        # Between two batches the migrator holds no lock: another session writes at once (it
        # would fail after 100 ms otherwise), and what the batches keyed is committed.
        other = connect(scratch_url)
        rows(other, "SET lock_timeout = '100ms'")
        rows(other, "UPDATE subscribers SET name = 'still writable' WHERE user_id = 'n2500'")
        progress.append(rows(other, "SELECT count(canonical_email) FROM subscribers")[0][0])
        other.close()
        return result

    monkeypatch.setattr(migrate, "batch", watched)
    applied = migrate.migrate(scratch_url)
    assert applied[:3] == ["0600", "0601", "0602"]
    assert progress[0] < progress[1] < progress[2] == 2504  # keyed in committed batches of 1,000

    assert [(e, k) for e, k in rows(conn, "SELECT email, canonical_email FROM subscribers") if canonical(e) != k] == []
    assert rows(
        conn, "SELECT user_id, canonical_email FROM subscribers WHERE user_id IN ('ana', 'bo', 'dee') ORDER BY user_id"
    ) == [("ana", "ana@xn--bcher-kva.example"), ("bo", "bo@example.com"), ("dee", "dee@" + "ü" * 70 + ".com")]
    assert rows(conn, "SELECT id, email, reason, source, created_at FROM suppressions ORDER BY email") == [
        (
            ids["ana@xn--bcher-kva.example"],
            "ana@xn--bcher-kva.example",
            "spamreport",
            "sendgrid:spamreport; merged bounce (sendgrid:bounce); merged unsubscribe (no source)",
            T0,
        ),
        (
            ids["bo@example.com"],
            "bo@example.com",
            "erased",
            "sendgrid:bounce; merged erased (erasure)",
            T0 + timedelta(days=1),
        ),
        (ids["cy@example.com"], "cy@example.com", "manual", None, T0),
    ]
    assert rows(conn, "SELECT sg_event_id, canonical_email FROM webhook_events ORDER BY 1") == [
        ("sg-1", "ana@xn--bcher-kva.example"),
        ("sg-2", None),
        ("sg-3", "cy@example.com"),
    ]
    assert rows(
        conn, "SELECT convalidated FROM pg_constraint WHERE conname = 'subscribers_canonical_email_present'"
    ) == [(True,)]
    assert rows(
        conn,
        "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'subscribers'::regclass AND c.relname LIKE 'subscribers_%email%'",
    ) == [("subscribers_canonical_email_idx", True)]
    # Running it again (python -m app rekey-addresses) finds nothing to change.
    assert rekey.rekey(conn) == {"subscribers": 0, "suppressions": 0, "webhook_events": 0}
    conn.close()


def test_rekey_repairs_a_key_a_previous_release_left_behind(scratch_url, settings, capsys):
    """During a deploy the previous release's processes do not know canonical_email: a non-ASCII
    address they change keeps the key of the old one until rekey-addresses runs."""
    settings(migration_database_url=scratch_url)
    migrate.migrate(scratch_url)
    conn = connect(scratch_url)
    rows(
        conn,
        "INSERT INTO subscribers (user_id, email, canonical_email) VALUES ('a', 'Ana@Example.com', 'ana@example.com')",
    )
    rows(conn, "UPDATE subscribers SET email = 'Ana@Bücher.example'")  # the old code's write
    assert rows(conn, "SELECT canonical_email FROM subscribers") == [("ana@example.com",)]
    rows(conn, "INSERT INTO suppressions (email, reason) VALUES ('ana@bücher.example', 'bounce')")
    assert cli_main(["rekey-addresses"]) == 0
    assert capsys.readouterr().out == (
        "subscribers: 1 row(s) rekeyed, suppressions: 1 row(s) rekeyed, webhook_events: 0 row(s) rekeyed\n"
    )
    assert rows(conn, "SELECT canonical_email FROM subscribers") == [("ana@xn--bcher-kva.example",)]
    assert rows(conn, "SELECT email FROM suppressions") == [("ana@xn--bcher-kva.example",)]
    conn.close()


# -- the runner's python step ----------------------------------------------------------------------

calls = []


def step_that_fills(conn):
    assert conn.autocommit  # the step commits its own batches
    with conn.cursor() as cur:
        cur.execute("UPDATE t SET v = id * 10")
    calls.append("fills")


def step_that_fails(conn):
    calls.append("fails")
    raise RuntimeError("half-way")


def test_a_python_step_runs_after_its_sql_and_a_failure_leaves_it_pending(
    scratch_url,
    tmp_path,
    monkeypatch,
):
    real_discover = migrate.discover
    monkeypatch.setattr(migrate, "discover", lambda directory=tmp_path: real_discover(directory))
    (tmp_path / "0001_t.sql").write_text("CREATE TABLE t (id int PRIMARY KEY, v int);")
    (tmp_path / "0002_fill.sql").write_text(
        f"-- migrate: python {__name__}:step_that_fails\nINSERT INTO t (id) VALUES (1), (2);"
    )
    calls.clear()
    with pytest.raises(RuntimeError, match="half-way"):
        migrate.migrate(scratch_url)
    assert [r["state"] for r in migrate.status(scratch_url)] == ["applied", "pending"]
    (tmp_path / "0002_fill.sql").write_text(
        f"-- migrate: python {__name__}:step_that_fills\nINSERT INTO t (id) VALUES (1), (2) ON CONFLICT DO NOTHING;"
    )
    assert migrate.migrate(scratch_url) == ["0002"]
    assert calls == ["fails", "fills"]
    conn = connect(scratch_url)
    assert rows(conn, "SELECT id, v FROM t ORDER BY id") == [(1, 10), (2, 20)]
    conn.close()
    assert not migrate.discover()[1].transactional
