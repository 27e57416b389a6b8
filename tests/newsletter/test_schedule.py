"""Scheduled newsletters: send_at (status `scheduled`, started by the scheduler tick) and local_time
(each recipient at that wall-clock time in their own zone, across DST). Real Postgres and Redis, a
real local fake SendGrid, the send loop called in process as the actor calls it.

Time passing is simulated by moving the stored moments (send_at, send_requested_at, not_before)
into the past: the statements compare them with the database's now()."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest

from app.cli import scheduler
from app.newsletter import outbox, reclaim, schedule, sender, service
from app.platform import db
from tests import factories
from tests.conftest import auth
from tests.newsletter_support import counts, drain, newsletter_status
from tests.web.test_admin_routes import admin  # noqa: F401 (a fixture)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _later(**delta) -> datetime:
    return datetime.now(UTC) + timedelta(**delta)


def _send_at(newsletter_id: int):
    return db.query("SELECT send_at FROM newsletters WHERE id = %s", (newsletter_id,))[0][0]


def _come(newsletter_id: int) -> None:
    """send_at has come."""
    db.query("UPDATE newsletters SET send_at = now() - interval '1 second' WHERE id = %s", (newsletter_id,))


def _outbox_rows(newsletter_id: int) -> int:
    return db.query("SELECT count(*) FROM email_log WHERE newsletter_id = %s", (newsletter_id,))[0][0]


# ---------------------------------------------------------------- send_at


def test_a_scheduled_newsletter_is_not_claimed_before_send_at_and_the_tick_starts_it(fake, provider):
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    assert service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1)) == "scheduled"
    # the outbox actor, should a message reach it, builds nothing; a send chain claims nothing
    assert outbox.create_outbox(nl) == 0
    assert sender.send_batch(nl, provider=provider, reenqueue=False).claimed == 0
    assert scheduler.run_hooks({"s": schedule.start_due}) == {"s": {"started": []}}
    assert reclaim.reclaim_stale()["outbox_kicked"] == []
    assert (newsletter_status(nl), _outbox_rows(nl), fake.calls) == ("scheduled", 0, 0)

    _come(nl)
    result = scheduler.tick()
    assert result["hooks"]["newsletter_scheduled"] == {"started": [nl]}
    assert newsletter_status(nl) == "queued"
    assert scheduler.tick()["hooks"]["newsletter_scheduled"] == {"started": []}  # started once
    outbox.create_outbox(nl)  # what the kicked create_outbox actor does
    drain(nl, provider)
    assert counts(nl) == {"sent": 3} and newsletter_status(nl) == "done"


def test_a_lost_outbox_message_of_a_started_send_is_kicked_again_after_the_grace(redis_client):
    factories.seed_subscribers(1)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1))
    db.query("UPDATE newsletters SET send_requested_at = now() - interval '2 days' WHERE id = %s", (nl,))
    _come(nl)
    schedule.start_due()
    # started a second ago: its outbox message is probably still queued (the request is older)
    assert reclaim.reclaim_stale()["outbox_kicked"] == []
    db.query("UPDATE newsletters SET send_at = now() - interval '1 hour' WHERE id = %s", (nl,))
    redis_client.flushdb()  # the message is gone
    assert reclaim.reclaim_stale()["outbox_kicked"] == [nl]


def test_cancel_while_scheduled(fake, provider):
    factories.seed_subscribers(2)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1))
    assert service.cancel(nl) == service.Cancelled(id=nl, status="cancelled", cancelled_rows=0)
    _come(nl)
    assert schedule.start_due() == {"started": []}
    assert outbox.create_outbox(nl) == 0
    assert (newsletter_status(nl), _outbox_rows(nl), fake.calls) == ("cancelled", 0, 0)
    with pytest.raises(service.Conflict):
        service.request_send(nl, {"kind": "all"}, send_at=_later(hours=2))


def test_reschedule_changes_the_time_and_audience_until_it_starts(fake, provider):
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(hours=5))
    sooner = _later(hours=1)
    assert service.request_send(nl, {"kind": "user_ids", "user_ids": ["u2"]}, send_at=sooner) == "scheduled"
    assert _send_at(nl) == sooner
    _come(nl)
    schedule.start_due()
    outbox.create_outbox(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 1} and [m["to"] for m in fake.delivered.values()] == ["user2@example.com"]
    with pytest.raises(service.Conflict, match="only a draft or scheduled"):
        service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1))


def test_sending_a_scheduled_newsletter_without_send_at_starts_it_now(redis_client):
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(days=1))
    assert service.request_send(nl, {"kind": "all"}) == "queued"
    assert _send_at(nl) is None


def test_a_scheduled_newsletter_cannot_be_paused_but_says_what_can_be_done():
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(days=1))
    with pytest.raises(service.Conflict, match="cancel it, or send it again"):
        service.pause(nl)


# ---------------------------------------------------------------- local_time


@pytest.mark.parametrize(
    "start,at,expected",
    [
        # the day before Lisbon springs forward (Sun 29 March 2026, 01:00 UTC): its 09:00 is WEST
        (
            utc(2026, 3, 28, 12),
            time(9),
            {
                "Europe/Lisbon": utc(2026, 3, 29, 8),
                "America/New_York": utc(2026, 3, 28, 13),
                "Asia/Tokyo": utc(2026, 3, 29, 0),
            },
        ),
        # the day before it falls back (Sun 25 October 2026, 01:00 UTC): its 09:00 is WET again
        (
            utc(2026, 10, 24, 12),
            time(9),
            {
                "Europe/Lisbon": utc(2026, 10, 25, 9),
                "America/New_York": utc(2026, 10, 24, 13),
                "Asia/Tokyo": utc(2026, 10, 25, 0),
            },
        ),
        # 01:30 does not exist in Lisbon on 29 March (01:00 -> 02:00): the moment past the gap
        (utc(2026, 3, 29, 0), time(1, 30), {"Europe/Lisbon": utc(2026, 3, 29, 1, 30)}),
        # 01:30 happens twice in Lisbon on 25 October: the first time
        (utc(2026, 10, 25, 0), time(1, 30), {"Europe/Lisbon": utc(2026, 10, 25, 0, 30)}),
        # already past locally when the send starts: tomorrow, within 24 h
        (utc(2026, 5, 1, 10), time(9), {"Europe/Lisbon": utc(2026, 5, 2, 8), "UTC": utc(2026, 5, 2, 9)}),
        (utc(2026, 5, 1, 9), time(9), {"UTC": utc(2026, 5, 1, 9)}),
    ],
)
def test_each_recipients_not_before_is_local_time_in_their_zone_across_dst(redis_client, start, at, expected):
    for i, zone in enumerate(expected):
        factories.subscriber(f"u{i}", timezone=zone)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, local_time=at)
    db.query("UPDATE newsletters SET send_requested_at = %s WHERE id = %s", (start, nl))
    outbox.create_outbox(nl)
    got = dict(
        db.query(
            "SELECT s.timezone, e.not_before FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id "
            "WHERE e.newsletter_id = %s",
            (nl,),
        )
    )
    assert got == expected
    assert all(start <= due < start + timedelta(hours=24) for due in got.values())


def test_a_zone_written_around_the_api_gets_utc(redis_client):
    sid = factories.subscriber("u1")
    db.query("UPDATE subscribers SET timezone = 'Mars/Olympus_Mons' WHERE id = %s", (sid,))
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, local_time=time(9))
    db.query("UPDATE newsletters SET send_requested_at = %s WHERE id = %s", (utc(2026, 5, 1, 10), nl))
    outbox.create_outbox(nl)
    assert db.query("SELECT not_before FROM email_log") == [(utc(2026, 5, 2, 9),)]


def test_next_local_handles_offsets_off_the_hour():
    start = utc(2026, 3, 28, 23, 45)
    assert schedule.next_local(start, "Asia/Kathmandu", time(9)) == utc(2026, 3, 29, 3, 15)  # +05:45
    assert schedule.next_local(start, "America/St_Johns", time(9)) == utc(2026, 3, 29, 11, 30)  # -02:30 NDT


def test_a_scheduled_local_time_send_counts_from_send_at(redis_client):
    factories.subscriber("u1", timezone="Asia/Tokyo")
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1), local_time=time(9))
    db.query("UPDATE newsletters SET send_at = %s WHERE id = %s", (utc(2026, 3, 28, 12), nl))
    schedule.start_due()
    outbox.create_outbox(nl)
    assert db.query("SELECT not_before FROM email_log") == [(utc(2026, 3, 29, 0),)]


def _due_in_utc_not_in_tokyo(newsletter_id: int) -> None:
    """Started 12 h ago at a local_time 6 h ago in UTC: due for a UTC recipient, in 9 h in Tokyo."""
    at = (datetime.now(UTC) - timedelta(hours=6)).time().replace(second=0, microsecond=0)
    service.request_send(newsletter_id, {"kind": "all"}, local_time=at)
    db.query("UPDATE newsletters SET send_requested_at = now() - interval '12 hours' WHERE id = %s", (newsletter_id,))
    outbox.create_outbox(newsletter_id)


def test_the_claim_skips_rows_until_their_local_time_and_the_send_finishes_after(fake, provider):
    factories.subscriber("london", email="utc@example.com", timezone="UTC")
    factories.subscriber("tokyo", email="tokyo@example.com", timezone="Asia/Tokyo")
    nl = factories.newsletter()
    _due_in_utc_not_in_tokyo(nl)
    rounds = drain(nl, provider)
    assert [m["to"] for m in fake.delivered.values()] == ["utc@example.com"]
    assert counts(nl) == {"sent": 1, "pending": 1} and newsletter_status(nl) == "sending"
    assert "not due for 60s or more" in rounds[-1].outcome and rounds[-1].retry_in is None
    # the tick does not wake send chains for rows not yet due
    assert reclaim.reclaim_stale()["chains_kicked"] == []
    status = service.newsletter_status(nl)
    assert status.local_time == db.query("SELECT to_char(local_time, 'HH24:MI') FROM newsletters")[0][0]

    db.query("UPDATE email_log SET not_before = now() - interval '1 second' WHERE status = 'pending'")
    assert reclaim.reclaim_stale()["chains_kicked"] == [nl]
    drain(nl, provider)
    assert counts(nl) == {"sent": 2} and newsletter_status(nl) == "done"


def test_a_chain_sleeps_until_the_next_row_is_due_when_that_is_soon(fake, provider):
    factories.subscriber("tokyo", timezone="Asia/Tokyo")
    nl = factories.newsletter()
    _due_in_utc_not_in_tokyo(nl)
    db.query("UPDATE email_log SET not_before = now() + interval '30 seconds'")
    stats = sender.send_batch(nl, provider=provider, reenqueue=False)
    assert stats.claimed == 0 and 0.2 <= stats.retry_in <= 30


def test_pause_and_cancel_a_partly_due_newsletter(fake, provider):
    factories.subscriber("london", timezone="UTC")
    factories.subscriber("tokyo", timezone="Asia/Tokyo")
    nl = factories.newsletter()
    _due_in_utc_not_in_tokyo(nl)
    assert service.pause(nl) == "paused"
    assert sender.send_batch(nl, provider=provider, reenqueue=False).claimed == 0
    assert service.resume(nl) == "sending"
    drain(nl, provider)
    assert counts(nl) == {"sent": 1, "pending": 1}
    assert service.cancel(nl) == service.Cancelled(id=nl, status="cancelled", cancelled_rows=1)
    assert counts(nl) == {"sent": 1, "cancelled": 1}


# ---------------------------------------------------------------- the API


def _send(client, key, nl, **body):
    return client.post(f"/v1/newsletters/{nl}/send", json={"audience": "all", **body}, headers=auth(key))


@pytest.mark.parametrize(
    "send_at,message",
    [
        ("2020-01-01T09:00:00Z", "must be in the future"),
        ("2999-01-01T09:00:00", "RFC 3339"),  # naive: no offset
        ("2999-01-01", "RFC 3339"),
        ("tomorrow", "RFC 3339"),
        ("2999-02-30T09:00:00Z", "RFC 3339"),
        (1767261600, "must be a string"),
    ],
)
def test_send_at_must_be_an_rfc3339_moment_in_the_future(client, admin_key, send_at, message):
    nl = factories.newsletter()
    r = _send(client, admin_key, nl, send_at=send_at)
    assert r.status_code == 422
    (problem,) = r.json()["errors"]
    assert problem["field"] == "send_at" and message in problem["message"]
    assert newsletter_status(nl) == "draft"


@pytest.mark.parametrize("local_time", ["9:00", "24:00", "09:60", "09:00:00", "", 900])
def test_local_time_must_be_hh_mm(client, admin_key, local_time):
    nl = factories.newsletter()
    r = _send(client, admin_key, nl, local_time=local_time)
    assert r.status_code == 422 and [e["field"] for e in r.json()["errors"]] == ["local_time"]


def test_schedule_through_the_api_shows_in_status_and_list_and_can_be_cancelled(client, admin_key, redis_client):
    nl = factories.newsletter()
    r = _send(client, admin_key, nl, send_at="2999-03-29T09:00:00+01:00", local_time="09:00")
    assert r.status_code == 202 and r.json()["status"] == "scheduled"
    got = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()
    assert (got["status"], got["send_at"], got["local_time"]) == ("scheduled", "2999-03-29T08:00:00+00:00", "09:00")
    (item,) = client.get("/v1/newsletters?status=scheduled", headers=auth(admin_key)).json()["newsletters"]
    assert (item["id"], item["send_at"], item["local_time"]) == (nl, "2999-03-29T08:00:00+00:00", "09:00")
    r = _send(client, admin_key, nl, send_at="2999-03-30T10:00:00Z")  # rescheduled, now without local_time
    got = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()
    assert (got["send_at"], got["local_time"]) == ("2999-03-30T10:00:00+00:00", None)
    assert client.post(f"/v1/newsletters/{nl}/pause", headers=auth(admin_key)).status_code == 409
    assert client.post(f"/v1/newsletters/{nl}/cancel", headers=auth(admin_key)).json()["status"] == "cancelled"


def test_the_schedule_is_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    props = doc["components"]["schemas"]["NewsletterAudience"]["properties"]
    assert {"send_at", "local_time"} <= set(props)
    assert "scheduled" in doc["components"]["schemas"]["NewsletterStatus"]["properties"]["status"]["enum"]


# ---------------------------------------------------------------- the dashboard


def test_the_dashboard_and_the_newsletter_list_show_the_schedule(admin):
    nl = factories.newsletter_row(
        subject="Spring",
        status="scheduled",
        send_at=utc(2999, 3, 29, 8),
        local_time=time(9),
        audience='{"kind": "all"}',
    )
    for path in ("/admin/newsletters", "/admin"):
        page = admin.get(path).text
        assert f'<td data-label="#">{nl}</td>' in page
        assert '<span class="status status-scheduled">scheduled</span>' in page
        assert "starts 2999-03-29 08:00 UTC" in page and "at 09:00 recipient's local time" in page


def test_a_started_schedule_shows_what_it_was_for_and_when_it_started(admin, client, admin_key):
    """Issue 41: "Send started" showed when the request was made, and send_at vanished once the send
    began. Now send_at stays and started_at is the moment the tick started it."""
    factories.seed_subscribers(1)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=_later(hours=1))
    assert client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()["started_at"] is None
    assert "not yet" in admin.get("/admin/newsletters").text
    db.query(
        "UPDATE newsletters SET send_requested_at = %s, send_at = %s WHERE id = %s",
        (utc(2026, 3, 1, 9), utc(2026, 3, 3, 8), nl),
    )
    schedule.start_due()
    status = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()
    started = datetime.fromisoformat(status["started_at"])
    assert status["send_at"].startswith("2026-03-03T08:00") and abs(started - datetime.now(UTC)) < timedelta(minutes=1)
    page = admin.get("/admin/newsletters").text
    assert "scheduled for 2026-03-03 08:00 UTC" in page and "2026-03-01 09:00" not in page
    assert f'data-label="Started">{started.astimezone(UTC):%Y-%m-%d %H:%M} UTC<' in page

    # a send now starts when it is asked for, with no schedule to show
    now = factories.newsletter()
    service.request_send(now, {"kind": "all"})
    shown = client.get(f"/v1/newsletters/{now}", headers=auth(admin_key)).json()
    assert shown["send_at"] is None and shown["started_at"] == shown["send_requested_at"]
