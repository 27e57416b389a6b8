"""Monthly partitions of digest_events, webhook_events and email_link_history (migrations
0520-0525, app/platform/partitions.py), and the dedup keys that live beside them: a key is refused across
partition boundaries, by concurrent writers, after a row moved partition, and freed with its row."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import peewee
import psycopg2.errors
import pytest

from app.operations import erasure
from app.operations.audit import Operator
from app.platform import db, metrics, partitions
from tests import factories
from tests.conftest import auth, wait_for
from tracking import webhook_intake

INSERT_EVENT = (
    "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
    "received_at) VALUES (%s, %s, 'u1', 'likes', 'post', 'p1', coalesce(%s, now())) RETURNING id"
)


def months(table: str) -> list[partitions.Partition]:
    with db.raw_cursor() as cur:
        return partitions.list_partitions(cur, table)


def later_month(table: str):
    """A time inside the newest partition: a month other than the current one."""
    return months(table)[-1].range_from + timedelta(days=3)


def where(table: str, column: str, value) -> list[str]:
    return [r[0] for r in db.query(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", (value,))]


def post(client, key, event_id):
    r = client.post(
        "/v1/events",
        json={"id": event_id, "user_id": "u1", "category": "likes", "entity_type": "post", "entity_id": "p1"},
        headers=auth(key),
    )
    assert r.status_code == 202, r.text
    return r.json()


@pytest.mark.parametrize("table", [t.name for t in partitions.TABLES])
def test_tables_are_partitioned_by_month_with_three_months_ahead(table):
    parts = months(table)
    assert parts[0].range_from is None  # the table as it was before: MINVALUE
    assert all(a.range_to == b.range_from for a, b in itertools.pairwise(parts))  # contiguous
    assert all(p.range_from.day == 1 and p.range_to.day == 1 for p in parts[1:])
    ((now,),) = db.query("SELECT now()")
    months_ahead = (parts[-1].range_to.year - now.year) * 12 + parts[-1].range_to.month - now.month
    assert months_ahead >= partitions.AHEAD_MONTHS + 1  # this month and three more
    with db.raw_cursor() as cur:
        assert partitions.is_partitioned(cur, table)


def test_adding_months_ahead_is_idempotent():
    with db.connect_raw(autocommit=True) as conn:
        assert partitions.ensure_ahead(conn) == []
    assert all(months(t.name) for t in partitions.TABLES)


def test_a_duplicate_event_is_refused_across_a_partition_boundary(client, events_key):
    later = later_month("digest_events")
    # first stored this month through the API, re-sent next month: refused
    assert post(client, events_key, "e1") == {"accepted": 1, "duplicates": 0}
    assert db.query(INSERT_EVENT, ("producer-test", "e1", later)) == []
    # first stored in a later month, re-sent through the API now: a duplicate, not stored again
    ((row_id,),) = db.query(INSERT_EVENT, ("producer-test", "e2", later))
    assert post(client, events_key, "e2") == {"accepted": 0, "duplicates": 1}
    assert where("digest_events", "producer_id", "e2") == [months("digest_events")[-1].name]
    assert db.query("SELECT producer_id, count(*) FROM digest_events GROUP BY 1 ORDER BY 1") == [("e1", 1), ("e2", 1)]
    assert db.query("SELECT event_id FROM digest_event_keys WHERE producer_id = 'e2'") == [(row_id,)]
    # the key is the producer's: another producer may use the same id
    assert db.query(INSERT_EVENT, ("other-producer", "e2", later)) != []


def test_a_duplicate_webhook_event_is_refused_across_a_partition_boundary():
    later = later_month("webhook_events")
    db.query(
        "INSERT INTO webhook_events (sg_event_id, event, payload, received_at) VALUES ('sg-1', 'open', '{}', %s)",
        (later,),
    )
    with db.raw_cursor() as cur:
        first, second = webhook_intake.insert_jobs(
            cur, [[("sg-1", "open", None, "{}"), ("sg-2", "open", None, "{}")], [("sg-2", "open", None, "{}")]]
        )
    assert (first.stored, first.duplicates, second.stored, second.duplicates) == (1, 1, 0, 1)
    assert (
        db.query(
            "INSERT INTO webhook_events (sg_event_id, event, payload, received_at) "
            "VALUES ('sg-2', 'open', '{}', %s) RETURNING id",
            (later,),
        )
        == []
    )
    assert db.query("SELECT sg_event_id, count(*) FROM webhook_events GROUP BY 1 ORDER BY 1") == [
        ("sg-1", 1),
        ("sg-2", 1),
    ]


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_inserts_of_one_key_into_two_partitions_store_it_once(first_commits):
    """The second writer waits on the key, as it waited on the old unique index: once the first
    commits it stores nothing; if the first rolls back it stores its row."""
    later = later_month("digest_events")
    first = db.connect_raw()
    try:
        with first.cursor() as cur:
            cur.execute(INSERT_EVENT, ("p", "k1", None))
        result = {}

        def second():
            result["rows"] = db.query(INSERT_EVENT, ("p", "k1", later))

        thread = threading.Thread(target=second)
        thread.start()
        wait_for(
            lambda: db.query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO digest_events%%' AND datname = current_database()"
            ),
            10,
            "the second insert to wait",
        )
        first.commit() if first_commits else first.rollback()
        thread.join(10)
    finally:
        first.close()
    stored = where("digest_events", "producer_id", "k1")
    if first_commits:
        assert result["rows"] == [] and len(stored) == 1 and stored != [months("digest_events")[-1].name]
    else:
        assert len(result["rows"]) == 1 and stored == [months("digest_events")[-1].name]
    assert db.query("SELECT count(*) FROM digest_event_keys WHERE producer_id = 'k1'") == [(1,)]


def test_a_row_moved_to_another_partition_keeps_its_key():
    later = later_month("digest_events")
    ((row_id,),) = db.query(INSERT_EVENT, ("p", "m1", None))
    moved = db.query(
        "UPDATE digest_events SET received_at = %s WHERE id = %s RETURNING tableoid::regclass::text", (later, row_id)
    )
    assert moved == [(months("digest_events")[-1].name,)]  # Postgres moved it: DELETE + INSERT inside
    assert db.query("SELECT id FROM digest_events WHERE producer_id = 'm1'") == [(row_id,)]
    assert db.query(INSERT_EVENT, ("p", "m1", None)) == []  # still refused afterwards
    wh = db.query("INSERT INTO webhook_events (sg_event_id, event, payload) VALUES ('w1', 'open', '{}') RETURNING id")
    db.query("UPDATE webhook_events SET received_at = %s", (later_month("webhook_events"),))
    assert db.query("SELECT id FROM webhook_events") == wh


def test_changing_a_key_moves_it_and_a_taken_key_is_refused():
    ((a,),) = db.query(INSERT_EVENT, ("p", "a", None))
    db.query(INSERT_EVENT, ("p", "b", None))
    db.query("UPDATE digest_events SET producer_id = 'a2' WHERE id = %s", (a,))
    assert db.query(INSERT_EVENT, ("p", "a2", None)) == []
    assert len(db.query(INSERT_EVENT, ("p", "a", None))) == 1  # the old key is free again
    with pytest.raises(peewee.IntegrityError, match="digest_event_keys_pkey"):  # as the old unique key did
        db.query("UPDATE digest_events SET producer_id = 'b' WHERE id = %s", (a,))


def test_changing_a_webhook_key_moves_it_and_a_taken_key_is_refused():
    insert = "INSERT INTO webhook_events (sg_event_id, event, payload) VALUES (%s, 'open', '{}') RETURNING id"
    ((a,),) = db.query(insert, ("sg-a",))
    db.query(insert, ("sg-b",))
    db.query("UPDATE webhook_events SET sg_event_id = 'sg-a2' WHERE id = %s", (a,))
    assert db.query(insert, ("sg-a2",)) == []
    assert len(db.query(insert, ("sg-a",))) == 1  # the old key is free again
    with pytest.raises(peewee.IntegrityError, match="webhook_event_keys_pkey"):
        db.query("UPDATE webhook_events SET sg_event_id = 'sg-b' WHERE id = %s", (a,))


def test_marking_events_leaves_their_keys_alone():
    """The rename triggers run only when a key column changes, not for the digest's mark."""
    ((a,),) = db.query(INSERT_EVENT, ("p", "m", None))
    db.query("UPDATE digest_events SET digest_run_id = 7 WHERE id = %s", (a,))
    assert db.query("SELECT source, producer_id, event_id FROM digest_event_keys") == [("p", "m", a)]
    assert db.query(INSERT_EVENT, ("p", "m", None)) == []


def test_erasure_and_truncate_free_the_keys(client, events_key, admin_key):
    factories.subscriber("u1")
    assert post(client, events_key, "gone-1") == {"accepted": 1, "duplicates": 0}
    db.query(
        "INSERT INTO webhook_events (sg_event_id, event, email, payload) "
        "VALUES ('sg-erased', 'open', 'u1@example.test', '{}')"
    )
    assert erasure.erase_subscriber("u1", Operator("test"))
    assert db.query("SELECT count(*) FROM digest_event_keys") == [(0,)]
    assert db.query("SELECT count(*) FROM webhook_event_keys") == [(0,)]
    assert post(client, events_key, "gone-1") == {"accepted": 1, "duplicates": 0}  # as before partitioning
    db.query("TRUNCATE digest_events")
    assert db.query("SELECT count(*) FROM digest_event_keys") == [(0,)]
    assert post(client, events_key, "gone-1") == {"accepted": 1, "duplicates": 0}


def test_the_previous_releases_inserts_fail_whole_after_the_swap():
    """During a rolling deploy an old web process names the unique keys that are gone: its insert
    fails as a whole (503 / 5xx, retried by the producer or SendGrid), nothing half-written."""
    old_event = (
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id) "
        "VALUES ('p', 'x', 'u1', 'likes', 'post', 'p1') ON CONFLICT (source, producer_id) DO NOTHING"
    )
    old_webhook = (
        "INSERT INTO webhook_events (sg_event_id, event, payload) VALUES ('x', 'open', '{}') "
        "ON CONFLICT (sg_event_id) DO NOTHING"
    )
    conn = db.connect_raw()
    try:
        for statement in (old_event, old_webhook):
            with pytest.raises(psycopg2.errors.InvalidColumnReference), db.transaction(conn) as cur:
                cur.execute(statement)
    finally:
        conn.close()
    assert db.query(
        "SELECT (SELECT count(*) FROM digest_events) + (SELECT count(*) FROM webhook_events) "
        "+ (SELECT count(*) FROM digest_event_keys) + (SELECT count(*) FROM webhook_event_keys)"
    ) == [(0,)]


def test_how_far_the_months_reach_is_exported():
    ((ahead,),) = db.query(
        "SELECT extract(epoch FROM (SELECT max(range_to) FROM time_partitions('digest_events')) - now())"
    )
    families = {f.name: f for f in metrics.StateCollector().collect()}
    value = families["notify_partitions_ahead_seconds"].samples[0].value
    assert 60 * 86400 < value <= float(ahead)
