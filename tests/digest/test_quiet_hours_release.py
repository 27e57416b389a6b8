"""Held mail when quiet hours end (issue 40, items 5 and 6): what the subscriber saw in the feed
while the mail waited is left out of it, a held mail left with nothing unseen is not sent, and a
held run that goes out is counted in notify_mail_released_total (once, and only held runs). Real
Postgres, Redis, the feed API and an SMTP sink; the window is a real one around now (Asia/Tokyo),
ended as tests/digest/test_quiet_hours_hold.py ends it (the window moved away, the run due)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.platform import db, metrics
from digest import immediate
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.digest_support import marked, run_row, sink_as_provider

ZONE = "Asia/Tokyo"


def window(hours_before: int, hours_after: int) -> str:
    """A stored window from `hours_before` ago to `hours_after` ahead, in the subscriber's zone."""
    now = datetime.now(ZoneInfo(ZONE))
    return f"{(now - timedelta(hours=hours_before)):%H:%M}-{(now + timedelta(hours=hours_after)):%H:%M}"


def window_ends(sid: int) -> None:
    """The window is over: it no longer holds now, and the held run is due (as the checker finds it)."""
    db.query("UPDATE subscribers SET quiet_hours = %s WHERE id = %s", (window(-3, 4), sid))
    db.query(
        "UPDATE digest_runs SET scheduled_for = now() - interval '1 second', next_attempt_at = NULL "
        "WHERE subscriber_id = %s AND status = 'pending'",
        (sid,),
    )


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def released_total() -> float:
    return metrics.MAIL_RELEASED._value.get()


def text_of(msg) -> str:
    return msg.get_body(("plain",)).get_content().replace("\r\n", "\n")


def held_send_now_run(user_id: str, entities: list[str]) -> tuple[int, int, list[int]]:
    """An `immediately` subscriber inside quiet hours, an event per entity, the send-now pass and a
    worker's claim: the run is held. Returns (subscriber id, run id, event ids)."""
    sid = factories.subscriber(user_id, digest_cadence="immediately", timezone=ZONE, quiet_hours=window(1, 2))
    ids = [i for n, e in enumerate(entities) for i in factories.events(user_id, 1, entity_id=e, actor=f"a{n}")]
    db.query("INSERT INTO digest_send_now (subscriber_id) VALUES (%s) ON CONFLICT DO NOTHING", (sid,))
    _, due = immediate.plan(datetime.now(UTC))
    (rid,) = due
    assert digest_send.process(due)["sent"] == 0  # held, not sent
    row = run_row(rid)
    assert row["status"] == "pending" and row["scheduled_for"] > datetime.now(UTC) + timedelta(minutes=30)
    return sid, rid, ids


def test_what_was_seen_in_the_feed_while_held_is_left_out_of_the_held_mail(client, events_key, sink):
    sid, rid, ids = held_send_now_run("owl", ["p1", "p2"])
    # Seen in the app meanwhile, through the feed API.
    body = {"entities": [{"entity_type": "post", "entity_id": "p1"}]}
    r = client.post("/v1/subscribers/owl/seen", json=body, headers=auth(events_key))
    assert r.status_code == 202
    window_ends(sid)
    before = released_total()
    assert digest_send.process(None)["sent"] == 1
    (mail,) = sink.messages()
    text = text_of(mail)
    assert "while you were away:" in text
    assert "Post p2" in text and "Post p1" not in text
    assert run_row(rid)["status"] == "sent"
    assert set(marked(ids).values()) == {rid}  # the seen one is handled with it: it never comes back
    assert released_total() == before + 1


def test_a_held_mail_all_seen_meanwhile_is_not_sent(client, events_key, sink):
    sid, rid, ids = held_send_now_run("owl", ["p1", "p2"])
    assert client.post("/v1/subscribers/owl/seen", json={"all": True}, headers=auth(events_key)).status_code == 202
    window_ends(sid)
    before, skipped_seen = released_total(), metrics.DIGEST_SKIPPED_SEEN._value.get()
    counts = digest_send.process(None)
    assert counts["sent"] == 0 and counts["skipped_seen"] == 1
    assert sink.messages() == []
    row = run_row(rid)
    assert row["status"] == "skipped" and row["skip_reason"] == "already seen"
    assert set(marked(ids).values()) == {rid}
    assert released_total() == before  # nothing went out
    assert metrics.DIGEST_SKIPPED_SEEN._value.get() == skipped_seen + 1
    # a later digest does not bring them back either
    assert digest_send.process([factories.digest_run(sid, cadence="weekly")])["sent"] == 0


def test_released_counts_held_runs_once_and_no_other(sink):
    held_sid, held_rid, _ = held_send_now_run("owl", ["p1"])
    lark = factories.subscriber("lark", timezone=ZONE)  # no quiet hours: an ordinary digest
    factories.events("lark", 2)
    window_ends(held_sid)
    before = released_total()
    assert digest_send.process([held_rid, factories.digest_run(lark)])["sent"] == 2
    assert released_total() == before + 1
    assert db.query("SELECT count(*) FROM digest_runs WHERE held_at IS NOT NULL AND status = 'sent'") == [(1,)]
    # The same run recorded again (a watchdog's second sender): no second release counted.
    assert digest_send.process([held_rid])["sent"] == 0
    assert released_total() == before + 1
