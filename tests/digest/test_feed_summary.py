"""The feed's summary (feed_entities, migration 0680): per subscriber, entity and category the newest
activity, kept by the database. After any mix of inserts (duplicates and own activity included),
deletes, erasure, concurrent writers and retention dropping a month, it equals what the events
left say."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest

from app.platform import db, migrate, partitions, retention
from digest import ingest
from tests.scratch import scratch_url  # noqa: F401 - fixture

T0 = datetime(2026, 11, 1, tzinfo=UTC)
EXPECTED_SQL = """
SELECT user_id, entity_type, entity_id, category, max(occurred_at), max(id)
FROM digest_events WHERE actor_id IS DISTINCT FROM user_id
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
"""
SUMMARY_SQL = (
    "SELECT user_id, entity_type, entity_id, category, latest_at, latest_id FROM feed_entities ORDER BY 1, 2, 3, 4"
)


def row(producer_id, user="u1", entity="p1", category="like", actor="a1", minutes=0) -> tuple:
    occurred = (T0 + timedelta(minutes=minutes)).isoformat()
    return ("producer", producer_id, user, category, "post", entity, actor, actor, "{}", occurred)


def ingest_rows(*rows, conn=None) -> None:
    conn = conn or db.thread_connection.get()
    with db.transaction(conn) as cur:
        ingest.insert_rows(cur, [list(rows)])


def query(sql, params=None, conn=None):
    conn = conn or db.thread_connection.get()
    with db.transaction(conn) as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def assert_summary_matches_events(conn=None):
    assert query(SUMMARY_SQL, conn=conn) == query(EXPECTED_SQL, conn=conn)


def test_inserts_keep_the_newest_activity_per_entity_and_category():
    ingest_rows(row("e1", minutes=1), row("e2", minutes=5), row("e3", category="comment", minutes=3))
    ingest_rows(row("e4", minutes=2), row("e5", entity="p2", minutes=9))  # older than e2: p1/like keeps e2's time
    summary = query("SELECT entity_id, category, latest_at FROM feed_entities ORDER BY 1, 2")
    assert summary == [
        ("p1", "comment", T0 + timedelta(minutes=3)),
        ("p1", "like", T0 + timedelta(minutes=5)),
        ("p2", "like", T0 + timedelta(minutes=9)),
    ]
    assert_summary_matches_events()


def test_duplicates_and_own_activity_are_not_counted():
    ingest_rows(row("e1", minutes=1))
    ingest_rows(row("e1", minutes=50))  # the same producer id again: skipped by the dedup trigger
    ingest_rows(row("mine", actor="u1", minutes=60), row("mine-p9", actor="u1", entity="p9", minutes=60))
    assert query("SELECT entity_id, latest_at FROM feed_entities") == [("p1", T0 + timedelta(minutes=1))]
    assert_summary_matches_events()


def test_deleting_events_recomputes_their_entities():
    ingest_rows(row("e1", minutes=1), row("e2", minutes=5), row("e3", entity="p2", minutes=2))
    query("DELETE FROM digest_events WHERE producer_id IN ('e2', 'e3')")
    assert query("SELECT entity_id, latest_at FROM feed_entities") == [("p1", T0 + timedelta(minutes=1))]
    assert_summary_matches_events()


def test_erasure_takes_the_subscribers_summary(client, admin_key):
    headers = {"Authorization": f"Bearer {admin_key}"}
    for user in ("u1", "u2"):
        assert client.put(
            f"/v1/subscribers/{user}", json={"email": f"{user}@example.test"}, headers=headers
        ).status_code in (200, 201)
    ingest_rows(row("e1"), row("e2", user="u2"), row("e3", entity="p2"))
    assert client.delete("/v1/subscribers/u1", headers=headers).status_code in (200, 202, 204)
    assert query("SELECT user_id FROM feed_entities") == [("u2",)]
    assert_summary_matches_events()


def test_truncate_empties_it():
    ingest_rows(row("e1"))
    query("TRUNCATE digest_events")
    assert query("SELECT count(*) FROM feed_entities") == [(0,)]


def waits_for_the_open_one(open_work, waiting_work) -> None:
    """open_work(cursor) runs in a transaction left open; waiting_work(connection), on another
    connection, must wait for it and finish once it commits."""
    holder, other = db.connect_raw(), db.connect_raw()
    try:
        with holder.cursor() as cur:
            open_work(cur)
        done = threading.Event()

        def wait_then_run():
            waiting_work(other)
            done.set()

        thread = threading.Thread(target=wait_then_run)
        thread.start()
        assert not done.wait(0.5)  # blocked on the open transaction's row lock
        holder.commit()
        thread.join(10)
        assert done.is_set()
    finally:
        holder.close()
        other.close()


def test_a_delete_waiting_on_an_open_insert_counts_it():
    """An insert still open holds its entities' rows; a delete of the same entity's other events
    waits for it and then recomputes with the insert's event in view."""
    ingest_rows(row("old", minutes=1), row("gone", minutes=2))
    waits_for_the_open_one(
        lambda cur: ingest.insert_rows(cur, [[row("new", minutes=3)]]),
        lambda conn: query("DELETE FROM digest_events WHERE producer_id = 'gone'", conn=conn),
    )
    assert query("SELECT latest_at FROM feed_entities") == [(T0 + timedelta(minutes=3),)]
    assert_summary_matches_events()


def test_an_insert_waiting_on_an_open_delete_merges_after_it():
    ingest_rows(row("old", minutes=1), row("gone", minutes=5))
    waits_for_the_open_one(
        lambda cur: cur.execute("DELETE FROM digest_events WHERE producer_id = 'gone'"),
        lambda conn: ingest_rows(row("new", minutes=3), conn=conn),
    )
    assert query("SELECT latest_at FROM feed_entities") == [(T0 + timedelta(minutes=3),)]
    assert_summary_matches_events()


def test_concurrent_writers_in_any_order_leave_it_exact():
    """Four connections insert (out of id order across them) and delete on a few hot entities at
    once; whatever interleaving happened, the summary equals the events left."""
    errors: list[Exception] = []

    def writer(n: int) -> None:
        rng = random.Random(n)
        conn = db.connect_raw()
        try:
            for i in range(60):
                if rng.random() < 0.25:
                    query(
                        "DELETE FROM digest_events WHERE id IN (SELECT id FROM digest_events "
                        "WHERE entity_id = %s ORDER BY random() LIMIT 1)",
                        (f"p{rng.randrange(4)}",),
                        conn=conn,
                    )
                else:
                    batch = [
                        row(
                            f"w{n}-{i}-{k}",
                            user=f"u{rng.randrange(2)}",
                            entity=f"p{rng.randrange(4)}",
                            category=rng.choice(["like", "comment"]),
                            actor=rng.choice(["a1", "u0", "u1"]),
                            minutes=rng.randrange(1000),
                        )
                        for k in range(rng.randrange(1, 6))
                    ]
                    ingest_rows(*batch, conn=conn)
        except Exception as exc:  # reported by the test
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert query("SELECT count(*) FROM digest_events")[0][0] > 0
    assert_summary_matches_events()


@pytest.fixture
def scratch(scratch_url):
    migrate.migrate(scratch_url)
    conn = psycopg2.connect(scratch_url)
    conn.autocommit = True
    yield conn
    conn.close()


def test_retention_recomputes_the_entities_of_a_dropped_month(scratch, monkeypatch):
    """The legacy month goes: an entity only there leaves the summary, one whose newest activity
    was there falls back to its newest kept event. Pruned in chunks of 2 rows, several ticks."""
    conn = scratch
    monkeypatch.setattr(retention, "PRUNE_CHUNK", 2)
    ingest_rows(row("old-1", entity="only-old", minutes=50), row("old-2", entity="both", minutes=40), conn=conn)
    ingest_rows(row("old-3", entity="both", category="comment", minutes=5), conn=conn)
    ((now,),) = query("SELECT now()", conn=conn)
    future = now + timedelta(days=200)
    partitions.ensure_ahead(conn, future)
    kept_at = future - timedelta(days=10)
    query(
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id, "
        "occurred_at, received_at) VALUES ('producer', 'new-1', 'u1', 'like', 'post', 'both', 'a1', %s, %s)",
        (T0 + timedelta(minutes=10), kept_at),
        conn=conn,
    )
    ticks = 0
    while retention.run(conn, now=future, budget_seconds=0)["unfinished"]:
        ticks += 1
        assert ticks < 40
    assert query("SELECT to_regclass('digest_events_legacy')", conn=conn) == [(None,)]
    assert query("SELECT entity_id, category, latest_at FROM feed_entities", conn=conn) == [
        ("both", "like", T0 + timedelta(minutes=10))
    ]
    assert_summary_matches_events(conn)


def test_the_backfill_summarises_the_events_stored_before_it(scratch):
    """Events stored before migration 0680 (its triggers off here) get their summary from 0681, which
    merges with what inserts made meanwhile and drops the rows of user_ids with no event left."""
    conn = scratch
    query("ALTER TABLE digest_events DISABLE TRIGGER feed_entities_add", conn=conn)
    ingest_rows(row("e1", minutes=1), row("e2", minutes=7, category="comment"), row("e3", user="u2"), conn=conn)
    query("ALTER TABLE digest_events ENABLE TRIGGER feed_entities_add", conn=conn)
    ingest_rows(row("e4", minutes=3), conn=conn)  # after the trigger: merged, not replaced
    query("INSERT INTO feed_entities VALUES ('erased-meanwhile', 'post', 'p1', 'like', now(), 1)", conn=conn)
    backfill = Path(migrate.MIGRATIONS_DIR, "0681_feed_entities_backfill.sql").read_text()
    with db.transaction(conn) as cur:
        cur.execute(backfill)
    assert_summary_matches_events(conn)
