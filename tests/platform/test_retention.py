"""Retention (app/platform/retention.py): months older than RETENTION_DAYS go whole, never-included digest
events and never-applied webhook events are counted first (logged and exported), their dedup keys
go with them, and a drop stopped anywhere resumes. Each test has its own database: dropping the
current partitions of the shared one would break the tests after it."""

from __future__ import annotations

import contextlib
import itertools
from datetime import timedelta

import psycopg2
import pytest

from app.platform import config, db, metrics, migrate, partitions, retention
from digest import ingest
from tests.scratch import scratch_url  # noqa: F401 - fixture
from tracking import webhook_intake

pytestmark = pytest.mark.not_pooled(
    "a scratch database of its own, straight on Postgres, as the scheduler's retention job uses MIGRATION_DATABASE_URL"
)

AHEAD = timedelta(days=200)  # "now" for retention: every month until ~110 days from today has expired


def event_row(producer_id: str, user_id: str = "u1") -> tuple:
    return ("producer", producer_id, user_id, "likes", "post", "p1", None, None, "{}", None)


@pytest.fixture
def scratch(scratch_url):
    migrate.migrate(scratch_url)
    conn = psycopg2.connect(scratch_url)
    conn.autocommit = True
    yield scratch_url, conn
    conn.close()


def rows(conn, sql, params=None) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def ingest_events(conn, *producer_ids) -> ingest.Result:
    with db.transaction(conn) as cur:
        return ingest.insert_rows(cur, [[event_row(p) for p in producer_ids]])[0]


def later(conn):
    ((now,),) = rows(conn, "SELECT now()")
    return now + AHEAD


def counter(metric, table: str) -> float:
    return metric.labels(table)._value.get()


def test_expired_months_go_whole_and_never_used_rows_are_counted_first(scratch, caplog):
    url, conn = scratch
    future = later(conn)
    partitions.ensure_ahead(conn, future)  # the months a scheduler would have added by then
    kept_at = future - timedelta(days=10)
    # Received now (the partition that expires): 5 included in a sent digest, 3 never.
    ingest_events(conn, *[f"old-{i}" for i in range(8)])
    ((sid,),) = rows(conn, "INSERT INTO subscribers (user_id, email) VALUES ('u1', 'u1@example.test') RETURNING id")
    ((run,),) = rows(
        conn,
        "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status) "
        "VALUES (%s, 'daily', current_date, now(), 'sent') RETURNING id",
        (sid,),
    )
    rows(
        conn,
        "UPDATE digest_events SET digest_run_id = %s WHERE producer_id IN ('old-0','old-1','old-2','old-3','old-4')",
        (run,),
    )
    # Received 10 days before "now": kept.
    rows(
        conn,
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
        "received_at) SELECT 'producer', 'new-' || i, 'u1', 'likes', 'post', 'p1', %s "
        "FROM generate_series(1, 2) i",
        (kept_at,),
    )
    with db.transaction(conn) as cur:
        webhook_intake.insert_jobs(cur, [[(f"sg-{i}", "open", None, "{}") for i in range(5)]])
    rows(conn, "UPDATE webhook_events SET processed_at = now() WHERE sg_event_id <> 'sg-4'")
    rows(
        conn,
        "INSERT INTO webhook_events (sg_event_id, event, payload, received_at) VALUES ('sg-new', 'open', '{}', %s)",
        (kept_at,),
    )
    rows(
        conn,
        "INSERT INTO email_link_history (kind, mail_kind, mail_id, occurred_at) "
        "VALUES ('open', 'digest', 1, now()), ('open', 'digest', 1, now()), ('click', 'digest', 1, %s)",
        (kept_at,),
    )
    cutoff = future - timedelta(days=config.get().retention_days)
    expired = {
        t.name: [p.name for p in partitions.list_partitions(conn.cursor(), t.name) if p.range_to <= cutoff]
        for t in partitions.TABLES
    }
    assert all(names[0].endswith("_legacy") and len(names) > 1 for names in expired.values())
    before = {t: counter(metrics.RETENTION_NEVER_USED, t) for t in ("digest_events", "webhook_events")}
    dropped_before = counter(metrics.RETENTION_PARTITIONS, "digest_events")

    with caplog.at_level("INFO", logger="app.platform.retention"):
        result = retention.maintain(now=future, url=url)

    assert result["dropped"] == [n for t in partitions.TABLES for n in expired[t.name]]
    assert result["unfinished"] == 0
    for table in partitions.TABLES:
        left = partitions.list_partitions(conn.cursor(), table.name)
        assert all(p.range_to > cutoff for p in left) and left[0].range_from is not None
        assert all(a.range_to == b.range_from for a, b in itertools.pairwise(left))
        assert all(rows(conn, "SELECT to_regclass(%s)", (n,)) == [(None,)] for n in expired[table.name])
    drops = dict(rows(conn, "SELECT partition, never_used FROM retention_drops WHERE state = 'dropped'"))
    assert drops["digest_events_legacy"] == 3 and drops["webhook_events_legacy"] == 1
    assert drops["email_link_history_legacy"] is None
    assert all(drops[n] == 0 for n in expired["digest_events"][1:])  # the empty months
    assert counter(metrics.RETENTION_NEVER_USED, "digest_events") - before["digest_events"] == 3
    assert counter(metrics.RETENTION_NEVER_USED, "webhook_events") - before["webhook_events"] == 1
    assert counter(metrics.RETENTION_PARTITIONS, "digest_events") - dropped_before == len(expired["digest_events"])
    assert "digest_events_legacy detached (about" in caplog.text
    assert "3 of them were never included in a digest" in caplog.text
    # What was kept is whole; the dropped rows' keys are gone, so their ids may be used again.
    assert rows(conn, "SELECT producer_id FROM digest_events ORDER BY 1") == [("new-1",), ("new-2",)]
    assert rows(conn, "SELECT producer_id FROM digest_event_keys ORDER BY 1") == [("new-1",), ("new-2",)]
    assert rows(conn, "SELECT sg_event_id FROM webhook_event_keys") == [("sg-new",)]
    assert rows(conn, "SELECT kind FROM email_link_history") == [("click",)]
    reuse = (
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, received_at) "
        "VALUES ('producer', %s, 'u1', 'likes', 'post', 'p1', %s) RETURNING id"
    )
    assert len(rows(conn, reuse, ("old-6", kept_at))) == 1
    assert rows(conn, reuse, ("new-1", kept_at)) == []
    # Nothing left to do: the next tick is a no-op.
    assert retention.maintain(now=future, url=url) == {"created": [], "dropped": [], "unfinished": 0}


def test_a_drop_stopped_anywhere_resumes_and_counts_once(scratch, monkeypatch):
    """Whatever the time budget, each tick moves the oldest drop on by one step: detach and count,
    then one chunk of keys per tick here (PRUNE_CHUNK 3), then the drop."""
    _url, conn = scratch
    monkeypatch.setattr(retention, "PRUNE_CHUNK", 3)
    ingest_events(conn, *[f"e{i}" for i in range(10)])
    future = later(conn)
    partitions.ensure_ahead(conn, future)
    before = counter(metrics.RETENTION_NEVER_USED, "digest_events")

    retention.run(conn, now=future, budget_seconds=0)
    state = rows(
        conn, "SELECT state, never_used, keys_pruned_to FROM retention_drops WHERE partition = 'digest_events_legacy'"
    )
    ((first_three,),) = rows(conn, "SELECT max(id) FROM (SELECT id FROM digest_events_legacy ORDER BY id LIMIT 3) x")
    assert state == [("pruning", 10, first_three)]
    assert rows(conn, "SELECT count(*) FROM digest_event_keys") == [(7,)]
    ticks = 1
    while rows(conn, "SELECT state FROM retention_drops WHERE partition = 'digest_events_legacy'") != [("dropped",)]:
        retention.run(conn, now=future, budget_seconds=0)
        ticks += 1
        assert ticks < 10
    assert ticks == 4  # 3 + 3 + 3 + 1 keys, then the drop in that tick
    assert rows(conn, "SELECT count(*) FROM digest_event_keys") == [(0,)]
    assert counter(metrics.RETENTION_NEVER_USED, "digest_events") - before == 10
    while retention.run(conn, now=future, budget_seconds=0)["unfinished"]:
        ticks += 1
        assert ticks < 30


def test_an_interrupted_detach_is_finalized_and_never_blocks_ingestion(scratch, caplog):
    url, conn = scratch
    ingest_events(conn, "a", "b")
    future = later(conn)
    partitions.ensure_ahead(conn, future)
    reader = psycopg2.connect(url)  # a long query still reading digest_events
    with contextlib.closing(reader), reader.cursor() as cur:
        cur.execute("SELECT count(*) FROM digest_events")
        with caplog.at_level("WARNING", logger="app.platform.retention"):
            retention.run(conn, now=future)
        assert "retention of digest_events: lock not granted" in caplog.text
        assert [
            p.detach_pending
            for p in partitions.list_partitions(conn.cursor(), "digest_events")
            if p.name == "digest_events_legacy"
        ] == [True]
        # Meanwhile events keep arriving in the current month (here one after the expired ones:
        # this database's clock is in the month being detached).
        assert rows(
            conn,
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, "
            "entity_id, received_at) VALUES ('producer', 'c', 'u1', 'likes', 'post', 'p1', %s) "
            "RETURNING 1",
            (future,),
        ) == [(1,)]
        reader.commit()
    result = retention.run(conn, now=future)
    assert "digest_events_legacy" in result["dropped"]
    assert rows(conn, "SELECT never_used FROM retention_drops WHERE partition = 'digest_events_legacy'") == [(2,)]
    assert rows(conn, "SELECT producer_id FROM digest_events") == [("c",)]


def test_retention_off_keeps_every_month(scratch, settings):
    url, conn = scratch
    settings(retention_days=0)
    ingest_events(conn, "a")
    result = retention.maintain(now=later(conn), url=url)
    assert result["dropped"] == [] and result["created"]  # months are still added ahead
    assert rows(conn, "SELECT count(*) FROM digest_events") == [(1,)]


@pytest.mark.pure
@pytest.mark.parametrize("days, ok", [("0", True), ("7", True), ("90", True), ("3", False), ("-1", False)])
def test_retention_days_is_zero_or_at_least_a_week(monkeypatch, days, ok):
    monkeypatch.setenv("RETENTION_DAYS", days)
    if ok:
        assert config.load().retention_days == int(days)
    else:
        with pytest.raises(config.ConfigError, match="RETENTION_DAYS"):
            config.load()


def test_a_missing_month_is_added_by_the_scheduler_job_and_by_migrate(scratch):
    url, conn = scratch
    newest = partitions.list_partitions(conn.cursor(), "digest_events")[-1]
    rows(conn, f"ALTER TABLE digest_events DETACH PARTITION {newest.name}")
    rows(conn, f"DROP TABLE {newest.name}")
    # A row for a month without a partition is refused whole (the API answers 503).
    insert = (
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, received_at) "
        "VALUES ('producer', 'far', 'u1', 'likes', 'post', 'p1', %s) RETURNING id"
    )
    with pytest.raises(psycopg2.errors.CheckViolation, match="no partition"):
        rows(conn, insert, (newest.range_from,))
    assert rows(conn, "SELECT count(*) FROM digest_event_keys") == [(0,)]
    assert retention.maintain(url=url)["created"] == [newest.name]  # the scheduler's job, each tick
    assert len(rows(conn, insert, (newest.range_from,))) == 1
    rows(conn, f"ALTER TABLE digest_events DETACH PARTITION {newest.name}")
    rows(conn, f"DROP TABLE {newest.name}")
    migrate.migrate(url)  # every release
    assert partitions.list_partitions(conn.cursor(), "digest_events")[-1] == newest
