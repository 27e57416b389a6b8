"""Quiet hours hold digests and send-now mail (issue 40, item 2): a run due inside its subscriber's
window goes back to pending until the window ends, without an attempt counted; what comes meanwhile
joins it, so the end brings one mail with all of it. DEFAULT_QUIET_HOURS holds those who set none;
a subscriber's own window wins. (The window's end across DST: tests/subscribers/test_quiet_hours.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.platform import db, metrics
from digest import claim, immediate
from digest import send as digest_send
from tests import factories
from tests.digest_support import run_row, sink_as_provider
from tests.subscribers.test_quiet_hours import LISBON, NEW_YORK, SYDNEY, local, utc

ZONE = "Asia/Tokyo"


def around_now(hours_before: int = 1, hours_after: int = 2) -> dict:
    now = datetime.now(ZoneInfo(ZONE))
    return {
        "start": (now - timedelta(hours=hours_before)).strftime("%H:%M"),
        "end": (now + timedelta(hours=hours_after)).strftime("%H:%M"),
    }


def away_from_now() -> dict:
    return around_now(-3, 4)  # from three hours ahead to four hours ahead


def _window_ends(sid: int) -> None:
    """The window is over: the subscriber's quiet hours no longer hold now, and the held run is due."""
    db.query("UPDATE subscribers SET quiet_hours = %s WHERE id = %s", (_stored(away_from_now()), sid))
    db.query(
        "UPDATE digest_runs SET scheduled_for = now() - interval '1 second', next_attempt_at = NULL "
        "WHERE subscriber_id = %s AND status = 'pending'",
        (sid,),
    )


def _send_now_pass(sid: int):
    """What ingest does for an `immediately` subscriber's event (the mark), then a send-now pass."""
    db.query("INSERT INTO digest_send_now (subscriber_id) VALUES (%s) ON CONFLICT DO NOTHING", (sid,))
    return immediate.plan(datetime.now(UTC))


def _stored(window: dict) -> str:
    return f"{window['start']}-{window['end']}"


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def test_send_now_mail_in_quiet_hours_waits_and_goes_as_one_at_the_end(sink):
    sid = factories.subscriber(
        "night-owl", digest_cadence="immediately", timezone=ZONE, quiet_hours=_stored(around_now())
    )
    factories.events("night-owl", 1, entity_id="p1")
    _, due = _send_now_pass(sid)
    held_before = metrics.MAIL_HELD.labels("quiet_hours")._value.get()
    assert digest_send.process(due)["sent"] == 0 and sink.messages() == []
    (rid,) = due
    row = run_row(rid)
    assert row["status"] == "pending" and row["attempts"] == 0
    held_until = datetime.fromisoformat(
        factories.db.query("SELECT next_attempt_at::text FROM digest_runs WHERE id = %s", (rid,))[0][0]
    )
    assert timedelta(hours=1) < held_until - datetime.now(UTC) <= timedelta(hours=2)
    assert metrics.MAIL_HELD.labels("quiet_hours")._value.get() == held_before + 1
    # more comes meanwhile: no second run, it waits with the first
    factories.events("night-owl", 2, entity_id="p2", actor="bo", actor_name="Bo")
    _send_now_pass(sid)
    assert db.query("SELECT count(*) FROM digest_runs WHERE subscriber_id = %s", (sid,)) == [(1,)]
    assert digest_send.process(None)["sent"] == 0  # still not due
    _window_ends(sid)
    assert digest_send.process(None)["sent"] == 1
    (mail,) = sink.messages()
    text = mail.get_body(("plain",)).get_content()
    assert "Post p1" in text and "Post p2" in text  # all of it, in one mail
    assert "while you were away:" in text
    assert run_row(rid)["status"] == "sent" and run_row(rid)["event_count"] == 3


def test_a_digest_due_in_quiet_hours_moves_to_their_end_and_others_go(sink):
    quiet = factories.subscriber("quiet", timezone=ZONE, quiet_hours=_stored(around_now()))
    awake = factories.subscriber("awake", timezone=ZONE, quiet_hours=_stored(away_from_now()))
    runs = {}
    for user, sid in (("quiet", quiet), ("awake", awake)):
        factories.events(user, 2)
        runs[user] = factories.digest_run(sid)
    assert digest_send.process(list(runs.values()))["sent"] == 1
    assert [m["To"].addresses[0].username for m in sink.messages()] == ["awake"]
    row = run_row(runs["quiet"])
    assert row["status"] == "pending" and row["scheduled_for"] > datetime.now(UTC) + timedelta(hours=1)
    assert "while you were away" not in sink.messages()[0].get_body(("plain",)).get_content()


def test_the_default_holds_those_without_a_window_and_a_window_of_their_own_wins(sink, settings):
    settings(default_quiet_hours=_stored(around_now()))
    held = factories.subscriber("default-held", timezone=ZONE)
    own = factories.subscriber("own-window", timezone=ZONE, quiet_hours=_stored(away_from_now()))
    runs = []
    for user, sid in (("default-held", held), ("own-window", own)):
        factories.events(user, 1)
        runs.append(factories.digest_run(sid))
    assert digest_send.process(runs)["sent"] == 1
    assert [m["To"].addresses[0].username for m in sink.messages()] == ["own-window"]
    assert run_row(runs[0])["status"] == "pending"


# -- on a controlled clock, through the claim (digest/claim.py) -------------------------------------
@pytest.mark.parametrize(
    "zone,window,now,until",
    [
        (NEW_YORK, ("22:00", "02:30"), local(NEW_YORK, 2026, 3, 7, 23, 0), utc(2026, 3, 8, 7, 0)),
        (LISBON, ("00:00", "01:30"), local(LISBON, 2026, 3, 29, 0, 45), utc(2026, 3, 29, 1, 0)),
        (SYDNEY, ("01:00", "02:30"), local(SYDNEY, 2026, 10, 4, 1, 15), utc(2026, 10, 3, 16, 0)),
        (NEW_YORK, ("22:00", "01:30"), local(NEW_YORK, 2026, 10, 31, 23, 0), utc(2026, 11, 1, 5, 30)),
        (LISBON, ("23:00", "01:30"), local(LISBON, 2026, 10, 24, 23, 30), utc(2026, 10, 25, 0, 30)),
        (SYDNEY, ("22:00", "02:30"), local(SYDNEY, 2026, 4, 4, 23, 0), utc(2026, 4, 4, 15, 30)),
    ],
)
def test_a_run_claimed_inside_the_window_waits_for_its_dst_safe_end(zone, window, now, until):
    """The claim holds a due send-now run at the moment the clock says, back to pending until the
    window's end across both DST changes, no attempt counted; at the end it is claimed."""
    sid = factories.subscriber("owl", digest_cadence="immediately", timezone=zone.key, quiet_hours="-".join(window))
    factories.events("owl", 1)
    (rid,) = db.query(
        "INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for) "
        "VALUES (%s, 'immediately', current_date, 1, now() - interval '1 minute') RETURNING id",
        (sid,),
    )[0]
    with db.raw_cursor() as cur:
        ready, _ = claim.claim(cur, [rid], 10, 5, now=now.astimezone(UTC))
    assert ready == []
    [(status, attempts, next_attempt_at, held_at)] = db.query(
        "SELECT status, attempts, next_attempt_at, held_at FROM digest_runs WHERE id = %s", (rid,)
    )
    assert (status, attempts, next_attempt_at) == ("pending", 0, until) and held_at is not None
    db.query("UPDATE digest_runs SET next_attempt_at = NULL WHERE id = %s", (rid,))
    with db.raw_cursor() as cur:
        ready, _ = claim.claim(cur, [rid], 10, 5, now=until)
    assert [r.id for r in ready] == [rid] and ready[0].held
