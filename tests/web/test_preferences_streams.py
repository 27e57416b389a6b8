"""The preference centre's newsletter switch and its "next digest" line after saving."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from app.platform import db, tokens
from app.web.pages import schedule
from digest import plan
from tests import factories

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)  # a Wednesday


def sub_row(**values) -> dict:
    base = {
        "id": 1,
        "unsubscribed_at": None,
        "digest_cadence": "weekly",
        "timezone": "Europe/Lisbon",
        "digest_hour": 18,
        "digest_weekday": 4,
        "paused_until": None,
    }
    return {**base, **values}


@pytest.fixture
def no_stagger(settings):
    settings(digest_stagger_seconds=0)


@pytest.mark.pure
def test_next_digest_in_the_subscribers_zone(no_stagger):
    assert schedule.next_digest(sub_row(), NOW) == "Your next digest: Friday 27 Nov, 18:00 Europe/Lisbon."
    daily = sub_row(digest_cadence="daily", timezone="America/New_York", digest_hour=6)
    assert schedule.next_digest(daily, NOW) == "Your next digest: Thursday 26 Nov, 06:00 America/New_York."
    hourly = sub_row(digest_cadence="hourly", timezone="Asia/Kathmandu")  # +05:45: 17:45 -> 18:00
    assert schedule.next_digest(hourly, NOW) == "Your next digest: Wednesday 25 Nov, 18:00 Asia/Kathmandu."


@pytest.mark.pure
def test_next_digest_names_the_time_with_the_subscribers_stagger(settings):
    settings(digest_stagger_seconds=3600)
    assert plan.stagger_seconds(1, 3600) == 961  # subscriber 1: 16 min
    assert schedule.next_digest(sub_row(), NOW) == "Your next digest: Friday 27 Nov, 18:16 Europe/Lisbon."
    settings(digest_stagger_seconds=86_400)  # hourly: an hour at most
    assert (
        schedule.next_digest(sub_row(digest_cadence="hourly"), NOW)
        == "Your next digest: Wednesday 25 Nov, 12:16 Europe/Lisbon."
    )


@pytest.mark.pure
def test_next_digest_when_paused_off_unsubscribed_or_without_slots(no_stagger):
    paused = sub_row(paused_until=NOW + timedelta(days=3))  # Saturday: the Friday slot is skipped
    assert (
        schedule.next_digest(paused, NOW)
        == "Emails are paused; your next digest after that: Friday 4 Dec, 18:00 Europe/Lisbon."
    )
    assert schedule.next_digest(sub_row(digest_cadence="off"), NOW) == "You will not get digests."
    assert schedule.next_digest(sub_row(unsubscribed_at=NOW), NOW).startswith("You are unsubscribed")
    # `immediately` has no slots (next_slot refuses it): described, not timed
    assert schedule.next_digest(sub_row(digest_cadence="immediately"), NOW) == "Digests arrive as things happen."


@pytest.mark.pure
def test_next_digest_names_the_waiting_run_not_the_slot_after_it(no_stagger):
    # Friday 18:05: the 18:00 run (staggered to 18:20) waits, or is due and not sent yet: not "next week"
    friday = datetime(2026, 11, 27, 18, 5, tzinfo=UTC)
    waiting = datetime(2026, 11, 27, 18, 20, tzinfo=UTC)
    assert schedule.next_digest(sub_row(), friday, waiting) == "Your next digest: Friday 27 Nov, 18:20 Europe/Lisbon."
    assert (
        schedule.next_digest(sub_row(), friday + timedelta(minutes=30), waiting)
        == "Your next digest is on its way (due Friday 27 Nov, 18:20 Europe/Lisbon)."
    )
    assert (
        schedule.next_digest(sub_row(paused_until=friday + timedelta(days=1)), friday, waiting)
        == "Emails are paused; your next digest after that: Friday 4 Dec, 18:00 Europe/Lisbon."
    )


def pref_path(sid: int) -> str:
    return "/preferences/" + tokens.make("preferences", sid, 1)


def save(client, sid: int, **fields):
    page = client.get(pref_path(sid))
    form = {
        "csrf_token": CSRF_RE.search(page.text).group(1),
        "action": "save",
        "digest_cadence": "weekly",
        "digest_hour": "18",
        "digest_weekday": "4",
        "timezone": "Europe/Lisbon",
        **fields,
    }
    r = client.post(pref_path(sid), data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    return client.get(r.headers["location"])


def newsletters_off_at(sid: int):
    return db.query("SELECT newsletters_unsubscribed_at FROM subscribers WHERE id = %s", (sid,))[0][0]


def test_saved_page_says_when_the_next_digest_arrives(client, no_stagger):
    sid = factories.subscriber("u1")
    page = save(client, sid, newsletters_shown="1", newsletters="yes")
    _, slot = plan.next_slot(datetime.now(UTC), "Europe/Lisbon", "weekly", 18, 4)
    assert f"Your next digest: {schedule.when(slot, 'Europe/Lisbon')}." in page.text
    assert "Your next digest" not in client.get(pref_path(sid)).text  # only after saving


def test_saved_page_names_the_run_that_is_due_but_not_sent_yet(client):
    sid = factories.subscriber(
        "u1", digest_cadence="weekly", digest_hour=18, digest_weekday=4, timezone="Europe/Lisbon"
    )
    due = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    factories.digest_run(sid, cadence="weekly", scheduled_for=due)
    factories.digest_run(sid, cadence="immediately", scheduled_for=due - timedelta(hours=1))  # not a digest
    page = save(client, sid, newsletters_shown="1", newsletters="yes")  # schedule unchanged: the run stays
    assert f"Your next digest is on its way (due {schedule.when(due, 'Europe/Lisbon')})." in page.text


def test_unticking_newsletters_stops_them_and_ticking_restores(client):
    sid = factories.subscriber("u1")
    assert 'name="newsletters" id="newsletters" value="yes" checked' in client.get(pref_path(sid)).text
    page = save(client, sid, newsletters_shown="1")  # box left unticked
    first = newsletters_off_at(sid)
    assert first is not None
    assert 'name="newsletters" id="newsletters" value="yes" aria' in page.text  # shown unticked
    save(client, sid, newsletters_shown="1")
    assert newsletters_off_at(sid) == first  # kept, not moved
    save(client, sid)  # a form without the switch
    assert newsletters_off_at(sid) == first
    save(client, sid, newsletters_shown="1", newsletters="yes")
    assert newsletters_off_at(sid) is None
