"""Digest marks (digest/marks.py, migration 0690): a digest records what it handled as its
subscriber's snapshot mark, not by rewriting event rows, and every event still lands in exactly one
digest — also when events commit out of id order around the digest's read."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from app.platform import db
from app.platform.providers.base import Provider, SendResult
from digest import events, marks, runs
from digest import send as digest_send
from tests import factories

INSERT = (
    "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id, payload) "
    "VALUES ('test', %(producer)s, %(user)s, 'like', 'post', %(entity)s, 'a', "
    "jsonb_build_object('title', 'Post ' || %(entity)s)) RETURNING id"
)


def row(producer: str, user: str, entity: str) -> dict:
    return {"producer": producer, "user": user, "entity": entity}


class Recording(Provider):
    """Accepts every mail; `during_send` runs once, while the batch is at the provider (after the
    events were read, before the outcome is recorded)."""

    name = "recording"
    max_batch = 100

    def __init__(self, during_send=None):
        self.sent = []
        self.during_send = during_send

    def send_batch(self, mails, progress=None):
        if self.during_send:
            self.during_send()
            self.during_send = None
        self.sent.extend(mails)
        return [SendResult(ok=True, message_id=f"m-{m.idempotency_key}") for m in mails]


def next_run(sid: int, day: int) -> int:
    return factories.digest_run(sid, period=datetime.now(UTC).date() + timedelta(days=day))


def covering_runs(event_ids) -> dict[int, list[int]]:
    """{event id: every run whose record covers it}: one by one, or by its snapshots. Exactly one run
    per event is the invariant; handled_by reports the first."""
    rows = db.query(marks.COVERING_RUNS.format(where="e.id = ANY (%s)"), (list(event_ids),))
    return {eid: sorted(set(runs)) for eid, runs in rows}


def test_a_sent_digest_rewrites_no_event_row():
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 5)
    before = dict(db.query("SELECT id, ctid::text FROM digest_events"))
    rid = next_run(sid, 0)
    assert digest_send.process([rid], provider=Recording())["sent"] == 1
    assert dict(db.query("SELECT id, ctid::text FROM digest_events")) == before  # not one row version
    assert db.query("SELECT count(*) FROM digest_events WHERE digest_run_id IS NOT NULL") == [(0,)]
    assert set(marks.handled_by(ids).values()) == {rid}
    assert db.query("SELECT count(*) FROM digest_marks WHERE subscriber_id = %s", (sid,)) == [(1,)]


def test_an_event_committed_out_of_id_order_lands_in_the_next_digest_not_lost():
    """The event with the SMALLER id commits AFTER the digest read the larger one: a high-water mark
    on ids would skip it for ever; the snapshot mark sends it in the next digest."""
    sid = factories.subscriber("u1")
    slow = db.connect_raw()
    try:
        with slow.cursor() as cur:
            cur.execute(INSERT, row("late", "u1", "late"))  # id drawn, not committed
            (late,) = cur.fetchone()
        (early,) = factories.events("u1", 1, entity_id="early")
        assert late < early
        first = next_run(sid, 0)
        provider = Recording()
        digest_send.process([first], provider=provider)
        slow.commit()
    finally:
        slow.close()
    second = next_run(sid, 1)
    digest_send.process([second], provider=provider)
    assert marks.handled_by([late, early]) == {early: first, late: second}
    assert covering_runs([late, early]) == {early: [first], late: [second]}
    assert ["Post early" in m.text for m in provider.sent] == [True, False]
    assert "Post late" in provider.sent[1].text and "Post late" not in provider.sent[0].text


@pytest.mark.parametrize("started_before_the_read", [True, False])
def test_an_event_committed_while_the_digest_is_at_the_provider_goes_in_the_next_one(started_before_the_read):
    sid = factories.subscriber("u1")
    (shown,) = factories.events("u1", 1, entity_id="shown")
    conn = db.connect_raw()
    arrived = []

    def insert():
        with conn.cursor() as cur:
            cur.execute(INSERT, row("mid", "u1", "mid"))
            arrived.append(cur.fetchone()[0])

    if started_before_the_read:
        insert()
    provider = Recording(during_send=lambda: (arrived or insert(), conn.commit()))
    try:
        first = next_run(sid, 0)
        digest_send.process([first], provider=provider)
    finally:
        conn.close()
    second = next_run(sid, 1)
    digest_send.process([second], provider=provider)
    assert marks.handled_by([shown, *arrived]) == {shown: first, arrived[0]: second}
    assert len(provider.sent) == 2


def test_concurrent_inserts_out_of_order_each_event_in_exactly_one_digest():
    """Writers commit events in random order and after random delays while digests of the same
    subscribers are built and sent again and again; at the end every event is covered by exactly one
    run, and the runs' counts add up to the events."""
    users = [f"u{i}" for i in range(4)]
    sids = {u: factories.subscriber(u) for u in users}
    stop = threading.Event()
    inserted: list[int] = []
    lock = threading.Lock()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        conn = db.connect_raw()
        try:
            n = 0
            while not stop.is_set():
                with conn.cursor() as cur:
                    mine = []
                    for _ in range(rng.randint(1, 3)):
                        n += 1
                        user = rng.choice(users)
                        cur.execute(INSERT, row(f"w{seed}-{n}", user, f"e{seed}-{n}"))
                        mine.append(cur.fetchone()[0])
                time.sleep(rng.random() * 0.02)  # ids drawn, commit later: out of id order across writers
                conn.commit()
                with lock:
                    inserted.extend(mine)
        finally:
            conn.close()

    writers = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for w in writers:
        w.start()
    provider = Recording()
    day = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            run_ids = [next_run(sid, day) for sid in sids.values()]
            digest_send.process(run_ids, provider=provider)
            day += 1
    finally:
        stop.set()
        for w in writers:
            w.join()
    run_ids = [next_run(sid, day) for sid in sids.values()]  # the last events
    digest_send.process(run_ids, provider=provider)
    covering = covering_runs(inserted)
    assert len(covering) == len(inserted) > 50
    assert {eid: runs for eid, runs in covering.items() if len(runs) != 1} == {}
    ((total,),) = db.query("SELECT coalesce(sum(event_count), 0) FROM digest_runs WHERE status = 'sent'")
    assert total == len(inserted)
    assert day > 3


def test_the_mark_never_moves_back():
    """A run the watchdog handed to a second worker may record after it: the older snapshot loses."""
    sid = factories.subscriber("u1")
    with db.raw_cursor() as cur:
        older, _ = marks.read(cur, [sid])
    factories.events("u1", 1)
    with db.raw_cursor() as cur:
        newer, _ = marks.read(cur, [sid])
        marks.advance(cur, [(sid, marks.Cover(None, newer))])
        marks.advance(cur, [(sid, marks.Cover(None, older))])
    assert db.query("SELECT through::text FROM digest_marks WHERE subscriber_id = %s", (sid,)) == [(newer,)]


def test_events_stored_before_the_upgrade_are_sent_once():
    """Migration 0691: events without a txid that no digest handled get one every snapshot shows."""
    sid = factories.subscriber("u1")
    old = factories.events("u1", 3)
    sent_before = factories.events("u1", 1, entity_id="p9", run_id=factories.digest_run(sid, status="sent"))
    db.query("UPDATE digest_events SET txid = NULL")  # as stored before 0690
    conn = db.connect_raw(autocommit=True)
    try:
        events.backfill_txid(conn)
    finally:
        conn.close()
    assert db.query("SELECT id, txid::text FROM digest_events ORDER BY id") == [
        *((i, "1") for i in old),
        (sent_before[0], None),
    ]
    rid = next_run(sid, 1)
    provider = Recording()
    digest_send.process([rid], provider=provider)
    assert marks.handled_by(old) == dict.fromkeys(old, rid) and len(provider.sent) == 1
    digest_send.process([next_run(sid, 2)], provider=provider)
    assert len(provider.sent) == 1  # nothing left


@pytest.mark.parametrize("newer_first", [False, True])
def test_a_run_recorded_twice_covers_what_both_workers_read(newer_first):
    """The watchdog gave a slow run to a second worker and both sent it (one Message-ID): the second
    record finds it sent. Whichever read later, the mark and the run's cover agree, so no event is
    left between them (sent, but in no run) and none is covered twice."""
    sid = factories.subscriber("u1")
    (first_event,) = factories.events("u1", 1)
    rid = next_run(sid, 0)
    with db.raw_cursor() as cur:
        older, _ = marks.read(cur, [sid])
    (second_event,) = factories.events("u1", 1, entity_id="p2")
    with db.raw_cursor() as cur:
        newer, _ = marks.read(cur, [sid])
    for snapshot in [newer, older] if newer_first else [older, newer]:
        with db.raw_cursor() as cur:
            runs.mark_sent(cur, [(rid, [], "mid")], {rid: (sid, marks.Cover(None, snapshot))})
    assert covering_runs([first_event, second_event]) == {first_event: [rid], second_event: [rid]}
    assert db.query("SELECT events_through::text FROM digest_runs WHERE id = %s", (rid,)) == [(newer,)]
    assert db.query("SELECT through::text FROM digest_marks WHERE subscriber_id = %s", (sid,)) == [(newer,)]
