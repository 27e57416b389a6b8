"""Newsletters and what makes mail wait (issue 40, items 2 and 4): a send with
`"respect_quiet_hours": true` holds each recipient's row while their window holds (their own, else
DEFAULT_QUIET_HOURS) until it ends; a recipient whose day's budget is spent waits for their next local
day, never dropped. Through the API, the outbox and the send loop, against a local fake provider."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from app.newsletter import outbox, reclaim, service
from app.platform import db, metrics
from app.subscribers import budget
from tests import factories
from tests.conftest import auth
from tests.digest.test_quiet_hours_hold import ZONE, _stored, around_now, away_from_now
from tests.newsletter_support import counts, drain, newsletter_status


def _start(nl: int, respect: bool) -> None:
    service.request_send(nl, {"kind": "all"}, respect_quiet_hours=respect)
    outbox.create_outbox(nl)


def _rows() -> dict[str, tuple]:
    return {
        user: (status, not_before)
        for user, status, not_before in db.query(
            "SELECT s.user_id, e.status, e.not_before FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id"
        )
    }


def test_a_send_that_respects_quiet_hours_holds_each_recipient_until_their_window_ends(fake, provider):
    factories.subscriber("asleep", timezone=ZONE, quiet_hours=_stored(around_now()))
    factories.subscriber("awake", timezone=ZONE, quiet_hours=_stored(away_from_now()))
    factories.subscriber("no-window", timezone=ZONE)
    nl = factories.newsletter()
    held_before = metrics.MAIL_HELD.labels("quiet_hours")._value.get()
    _start(nl, respect=True)
    drain(nl, provider)
    assert sorted(m["to"] for m in fake.delivered.values()) == ["awake@example.test", "no-window@example.test"]
    status, not_before = _rows()["asleep"]
    assert status == "pending" and timedelta(hours=1) < not_before - datetime.now(UTC) <= timedelta(hours=2)
    assert metrics.MAIL_HELD.labels("quiet_hours")._value.get() == held_before + 1
    assert db.query("SELECT attempts FROM email_log WHERE status = 'pending'") == [(0,)]
    assert newsletter_status(nl) == "sending" and reclaim.reclaim_stale()["chains_kicked"] == []
    # the window ends: the row is due, the tick kicks the chain, the send finishes
    db.query("UPDATE subscribers SET quiet_hours = %s WHERE user_id = 'asleep'", (_stored(away_from_now()),))
    db.query("UPDATE email_log SET not_before = now(), next_attempt_at = now() WHERE status = 'pending'")
    assert reclaim.reclaim_stale()["chains_kicked"] == [nl]
    drain(nl, provider)
    assert counts(nl) == {"sent": 3} and newsletter_status(nl) == "done"


def test_without_respect_quiet_hours_a_newsletter_goes_whatever_the_hour(fake, provider, settings):
    settings(default_quiet_hours=_stored(around_now()))
    factories.subscriber("asleep", timezone=ZONE, quiet_hours=_stored(around_now()))
    factories.subscriber("default", timezone=ZONE)
    nl = factories.newsletter()
    _start(nl, respect=False)
    drain(nl, provider)
    assert counts(nl) == {"sent": 2}


def test_the_default_window_holds_recipients_without_one(fake, provider, settings):
    settings(default_quiet_hours=_stored(around_now()))
    factories.subscriber("default", timezone=ZONE)
    factories.subscriber("own", timezone=ZONE, quiet_hours=_stored(away_from_now()))
    nl = factories.newsletter()
    _start(nl, respect=True)
    drain(nl, provider)
    assert [m["to"] for m in fake.delivered.values()] == ["own@example.test"]
    assert _rows()["default"][0] == "pending"


def test_a_recipient_over_budget_waits_for_their_next_local_day(fake, provider):
    sid = factories.subscriber("busy", timezone="Australia/Sydney", max_mails_per_day=1)
    factories.subscriber("free")
    with db.raw_cursor() as cur:
        assert (
            budget.spend(cur, [budget.Spend(sid, "Australia/Sydney", 1, must=True)], datetime.now(UTC)).refused == set()
        )  # a digest went today
    nl = factories.newsletter()
    _start(nl, respect=False)
    drain(nl, provider)
    assert [m["to"] for m in fake.delivered.values()] == ["free@example.test"]
    status, not_before = _rows()["busy"]
    sydney = ZoneInfo("Australia/Sydney")
    midnight = datetime.combine(datetime.now(sydney).date() + timedelta(days=1), datetime.min.time(), sydney)
    assert status == "pending" and not_before == midnight
    # the next day: it goes, and counts on that day
    db.query("UPDATE mail_budget SET day = day - 1")
    db.query("UPDATE email_log SET not_before = now(), next_attempt_at = now() WHERE status = 'pending'")
    drain(nl, provider)
    assert counts(nl) == {"sent": 2}
    assert budget.spent_today(sid, datetime.now(UTC)) == (1, 1)


def test_respect_quiet_hours_through_the_api_shows_in_status_and_a_repeat_must_agree(client, admin_key, redis_client):
    nl = factories.newsletter()
    r = client.post(
        f"/v1/newsletters/{nl}/send", json={"audience": "all", "respect_quiet_hours": True}, headers=auth(admin_key)
    )
    assert r.status_code == 202, r.text
    r = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key))
    assert r.json()["respect_quiet_hours"] is True
    r = client.post(f"/v1/newsletters/{nl}/send", json={"audience": "all"}, headers=auth(admin_key))
    assert r.status_code == 409 and "different respect_quiet_hours" in r.text
    r = client.post(
        f"/v1/newsletters/{nl}/send", json={"audience": "all", "respect_quiet_hours": "yes"}, headers=auth(admin_key)
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "respect_quiet_hours"
