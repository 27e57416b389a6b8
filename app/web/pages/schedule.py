"""When the next digest arrives, in words for the preference page ("Friday 27 Nov, 18:00 Europe/Lisbon"),
in the subscriber's language (the date as CLDR writes it there).

The time is when the subscriber's run is planned for, in their own zone: the run already waiting
(pending_run_at), which may be due and not yet sent, or else the next slot (digest.plan.next_slot)
plus the subscriber's stable stagger (within DIGEST_STAGGER_SECONDS; an hour at most for hourly), as
the planner will make it, moved to the end of the subscriber's quiet hours when it falls inside them.
Cadences without slots (next_slot refuses them) are described instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.platform import config, db, i18n, timezones
from app.subscribers import quiet_hours
from digest import plan


def when(moment: datetime, tz_name: str, t: i18n.Translator | None = None) -> str:
    t = t or i18n.translator(i18n.SOURCE)
    zone = timezones.load(tz_name)
    return t.gettext(
        "{date}, {time} {zone}",
        date=t.skeleton(moment, "MMMEEEEd", zone),
        time=t.skeleton(moment, "Hm", zone),
        zone=tz_name,
    )


def pending_run_at(subscriber: dict) -> datetime | None:
    """When the subscriber's waiting digest run (of their cadence, so not a send-now one) is due."""
    return db.query(
        "SELECT min(scheduled_for) FROM digest_runs WHERE subscriber_id = %s AND cadence = %s "
        "AND status IN ('pending', 'processing')",
        (subscriber["id"], subscriber["digest_cadence"]),
    )[0][0]


def _planned(subscriber: dict, start: datetime) -> datetime:
    """The run the planner makes for the first slot at or after `start`: slot + stagger."""
    cadence, tz_name = subscriber["digest_cadence"], subscriber["timezone"]
    _, slot = plan.next_slot(start, tz_name, cadence, subscriber["digest_hour"], subscriber["digest_weekday"])
    spread = plan.cadence_spread(cadence, config.get().digest_stagger_seconds)
    return slot + timedelta(seconds=plan.stagger_seconds(subscriber["id"], spread))


def next_digest(
    subscriber: dict, now: datetime, pending_at: datetime | None = None, t: i18n.Translator | None = None
) -> str:
    t = t or i18n.translator(i18n.SOURCE)
    if subscriber["unsubscribed_at"] is not None:
        return t.gettext("You are unsubscribed, so no digest will come.")
    cadence = subscriber["digest_cadence"]
    if cadence == "off":
        return t.gettext("You will not get digests.")
    tz_name = subscriber["timezone"]
    try:
        at = pending_at or _planned(subscriber, now)
    except ValueError:
        return t.gettext("Digests arrive as things happen.")
    paused_until = subscriber["paused_until"]
    if paused_until is not None and paused_until > at:
        return t.gettext(
            "Emails are paused; your next digest after that: {when}.",
            when=when(_planned(subscriber, paused_until), tz_name, t),
        )
    # A slot inside the subscriber's quiet hours moves to their end (digest/claim.py holds it there).
    default = quiet_hours.parse_setting(config.get().default_quiet_hours)
    moved = quiet_hours.subscriber_held_until(max(at, now), tz_name, subscriber.get("quiet_hours"), default)
    if moved is not None:
        return t.gettext("Your next digest: {when}, when your quiet hours end.", when=when(moved, tz_name, t))
    if at <= now:
        return t.gettext("Your next digest is on its way (due {when}).", when=when(at, tz_name, t))
    return t.gettext("Your next digest: {when}.", when=when(at, tz_name, t))
