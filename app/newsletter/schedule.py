"""Scheduled newsletters: when a newsletter starts, and when each recipient's mail is due.

`send_at`: the newsletter waits as `scheduled` (no outbox, so nothing can be claimed) until the
scheduler tick's hook ("app.newsletter.schedule:start_due") moves it to `queued` and kicks the
outbox builder, as a send without send_at does at once. Until then it can be sent again with
another send_at (rescheduled), sent now, or cancelled.

`local_time`: every outbox row carries `not_before`, the first moment at or after the start
(send_at, or the send request) at which the recipient's wall clock shows local_time, so everyone
gets it within 24 h at the same local hour. The claim skips rows not yet due. Wall-clock times are
zoneinfo's with fold=0, as digest slots are (digest/plan.py): a time in a spring-forward gap
means the moment just after the gap's start offset (01:30 in Lisbon on the last Sunday of March is
02:30 WEST), a repeated one its first occurrence.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta

from app.newsletter import kick
from app.newsletter import rows as newsletter_rows
from app.platform import db, timezones

log = logging.getLogger("app.newsletter.schedule")


def next_local(start: datetime, zone: str, at: time) -> datetime:
    """The first instant >= start whose wall clock in `zone` reads `at` (UTC)."""
    tz = timezones.load(zone)
    day = start.astimezone(tz).date() - timedelta(days=1)  # across a DST change the day before may still be ahead
    while True:
        candidate = datetime.combine(day, at, tzinfo=tz).astimezone(UTC)
        if candidate >= start:
            return candidate
        day += timedelta(days=1)


def due_times(start: datetime, at: time | None) -> dict[str, object]:
    """Parameters for the outbox's INSERT statements: each zone's not_before for a newsletter
    started at `start` (empty when it has no local_time: every row is due at once)."""
    if at is None:
        return {"zones": [], "due": [], "default_due": None}
    zones = sorted(timezones.names())
    return {
        "zones": zones,
        "due": [next_local(start, zone, at) for zone in zones],
        "default_due": next_local(start, "UTC", at),
    }


def start_due() -> dict[str, list[int]]:
    """Scheduler hook: `scheduled` newsletters whose send_at has come start (scheduled -> queued,
    one statement) and get their outbox built. Safe to run twice: a newsletter is started once;
    should the message be lost, the reclaimer re-kicks the outbox of a queued newsletter."""
    started = db.thread_connection.call(newsletter_rows.start_scheduled)
    for newsletter_id in started:
        log.info("newsletter %s: scheduled send starts", newsletter_id)
        try:
            kick.outbox(newsletter_id)
        except Exception as exc:  # the row is the truth: reclaim_stale re-kicks the outbox
            log.error("newsletter %s: could not kick the outbox (%s); the reclaimer will", newsletter_id, exc)
    return {"started": started}
