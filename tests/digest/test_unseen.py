"""Digests of only what was not seen (issue 24, item 5): an event seen or read in the app before its
digest is built is neither shown nor counted, still marked handled with the run; a digest left
with nothing unseen is skipped and counted; send-now mail waits UNSEEN_GRACE_SECONDS and drops
what was seen meanwhile. Real Postgres, Redis and an SMTP sink."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.platform import db, metrics
from digest import build as digest_build
from digest import hosted, immediate, seen
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.digest_support import marked, run_row, sink_as_provider


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def text_of(msg) -> str:
    return msg.get_body(("plain",)).get_content().replace("\r\n", "\n")


def mark(sid, kind, entities=None, at=None):
    with db.raw_cursor() as cur:
        seen.mark(cur, sid, kind, at or datetime.now(UTC), entities)


def skipped_seen_total() -> float:
    return metrics.DIGEST_SKIPPED_SEEN._value.get()


def test_seen_entities_are_neither_shown_nor_counted_but_are_handled(sink, settings):
    settings(digest_max_items=1)
    sid = factories.subscriber("u1")
    p1 = factories.events("u1", 3, entity_id="p1")
    p2 = factories.events("u1", 2, entity_id="p2")
    p3 = factories.events("u1", 1, entity_id="p3")
    mark(sid, "seen", [("post", "p1")])
    mark(sid, "read", [("post", "p3")])
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    (msg,) = sink.messages()
    text = text_of(msg)
    assert "Post p2" in text and "Post p1" not in text and "Post p3" not in text
    assert "2 updates" in text and "more update" not in text and "more update" not in msg["Subject"]
    # every loaded event is handled by the run: none comes back in a later digest
    assert set(marked(p1 + p2 + p3).values()) == {rid}
    assert run_row(rid)["event_count"] == 6
    assert digest_send.process([factories.digest_run(sid, cadence="weekly")])["sent"] == 0


def test_events_after_the_mark_are_unseen(sink):
    sid = factories.subscriber("u1")
    now = datetime.now(UTC)
    old = factories.events("u1", 2, entity_id="p1", when=now - timedelta(minutes=10))
    mark(sid, "seen", [("post", "p1")], at=now - timedelta(minutes=5))
    new = factories.events("u1", 1, entity_id="p1", actor="late", actor_name="Late Comer", when=now)
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    text = text_of(sink.messages()[0])
    assert "Late Comer" in text and "Actor a0" not in text and "1 update" in text
    assert set(marked(old + new).values()) == {rid}


def test_a_digest_with_nothing_unseen_is_skipped_counted_and_its_events_handled(sink):
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 3, entity_id="p1") + factories.events("u1", 1, entity_id="p2")
    mark(sid, "seen")  # "mark all": one row
    before = skipped_seen_total()
    rid = factories.digest_run(sid)
    counts = digest_send.process([rid])
    assert counts["sent"] == 0 and counts["skipped"] == 1 and counts["skipped_seen"] == 1
    assert skipped_seen_total() == before + 1
    assert sink.messages() == []
    row = run_row(rid)
    assert row["status"] == "skipped" and row["skip_reason"] == "already seen"
    assert set(marked(ids).values()) == {rid}


def test_without_any_state_the_digest_is_as_before(sink):
    sid = factories.subscriber("u1")
    factories.subscriber("u2")
    ids = factories.events("u1", 2, entity_id="p1")
    mark(2, "seen")  # somebody else's marks change nothing here
    rid = factories.digest_run(sid)
    counts = digest_send.process([rid])
    assert counts == {"sent": 1, "skipped": 0, "retry": 0, "failed": 0}
    assert "2 updates" in text_of(sink.messages()[0]) and set(marked(ids).values()) == {rid}


def test_the_preview_leaves_seen_events_out():
    sid = factories.subscriber("u1")
    factories.events("u1", 1, entity_id="p1")
    factories.events("u1", 1, entity_id="p2")
    assert "Post p1" in digest_build.preview("u1").text
    mark(sid, "read", [("post", "p1")])
    preview = digest_build.preview("u1")
    assert "Post p1" not in preview.text and "Post p2" in preview.text
    mark(sid, "seen")
    assert digest_build.preview("u1") is None


def test_the_hosted_copy_is_the_mail_as_sent(sink):
    sid = factories.subscriber("u1")
    factories.events("u1", 1, entity_id="p1")
    factories.events("u1", 1, entity_id="p2")
    mark(sid, "seen", [("post", "p1")])
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    subscriber = {"id": sid, "user_id": "u1", "token_version": 1, "name": "Ana Lima", "timezone": "UTC"}
    copy = hosted.render(rid, subscriber)
    assert "Post p2" in copy.html and "Post p1" not in copy.html
    mark(sid, "seen", [("post", "p2")])  # seen after the send: the copy does not change
    copy = hosted.render(rid, subscriber)
    assert "Post p2" in copy.html and "Post p1" not in copy.html


# -- send now waits UNSEEN_GRACE_SECONDS --------------------------------------------------------


def post_event(client, key, entity, **extra):
    body = {
        "id": f"e-{entity}",
        "user_id": "i",
        "category": "like",
        "entity_type": "post",
        "entity_id": entity,
        "actor_id": f"a-{entity}",
        "actor_name": f"Actor {entity}",
        **extra,
    }
    assert client.post("/v1/events", json=body, headers=auth(key)).status_code == 202


def due_now(run_id):
    """The grace has passed (as the checker would find the run at its time)."""
    db.query("UPDATE digest_runs SET scheduled_for = now() - interval '1 second' WHERE id = %s", (run_id,))


def test_send_now_waits_the_grace_and_drops_what_was_seen(client, events_key, sink, settings, caplog):
    settings(unseen_grace_seconds=60)
    sid = factories.subscriber("i", digest_cadence="immediately")
    post_event(client, events_key, "p1")
    post_event(client, events_key, "p2")
    now = datetime.now(UTC)
    caplog.set_level("INFO", logger="digest.immediate")
    created, due = immediate.plan(now, sending_now=True)
    assert created == 1 and due == []  # not due before the grace
    # The log says why none is due now (it said "1 run(s) created, 0 due now", which read as a fault).
    assert "send now: 1 run(s) created, 0 due at once and 1 after UNSEEN_GRACE_SECONDS" in caplog.text
    ((rid, scheduled_for),) = db.query("SELECT id, scheduled_for FROM digest_runs WHERE subscriber_id = %s", (sid,))
    assert scheduled_for == now + timedelta(seconds=60)
    mark(sid, "read", [("post", "p1")])  # opened in the app meanwhile
    due_now(rid)
    assert digest_send.process([rid])["sent"] == 1
    text = text_of(sink.messages()[0])
    assert "Post p2" in text and "Post p1" not in text


def test_a_high_priority_event_seen_within_the_grace_sends_nothing(client, events_key, sink, settings):
    settings(unseen_grace_seconds=60)
    sid = factories.subscriber("i", digest_cadence="daily")
    post_event(client, events_key, "urgent", priority="high")
    created, due = immediate.plan(datetime.now(UTC), sending_now=True)
    assert created == 1 and due == []
    mark(sid, "seen")
    ((rid,),) = db.query("SELECT id FROM digest_runs WHERE subscriber_id = %s", (sid,))
    due_now(rid)
    counts = digest_send.process([rid])
    assert counts["sent"] == 0 and counts["skipped_seen"] == 1 and sink.messages() == []
    # handled: the daily digest does not bring it back
    assert digest_send.process([factories.digest_run(sid)])["sent"] == 0


def test_no_grace_sends_at_once_as_before(client, events_key, sink):
    factories.subscriber("i", digest_cadence="immediately")
    post_event(client, events_key, "p1")
    created, due = immediate.plan(datetime.now(UTC), sending_now=True)
    assert created == 1 and len(due) == 1
