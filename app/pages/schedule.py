"""When the next digest arrives, in words for the preference page ("Friday 27 Nov, 18:00 Europe/Lisbon").

The time is the subscriber's slot (digest.plan.next_slot) in their own zone; the actual send falls
within DIGEST_STAGGER_SECONDS after it. Cadences without slots (next_slot refuses them) are
described instead.
"""
from __future__ import annotations

from datetime import datetime

from digest import plan
from digest.context import zone


def when(moment: datetime, tz_name: str) -> str:
    local = moment.astimezone(zone(tz_name))
    return f"{local:%A} {local.day} {local:%b}, {local:%H:%M} {tz_name}"


def next_digest(subscriber: dict, now: datetime) -> str:
    if subscriber["unsubscribed_at"] is not None:
        return "You are unsubscribed, so no digest will come."
    cadence = subscriber["digest_cadence"]
    if cadence == "off":
        return "You will not get digests."
    tz_name = subscriber["timezone"]
    try:
        _, slot = plan.next_slot(now, tz_name, cadence, subscriber["digest_hour"], subscriber["digest_weekday"])
    except ValueError:
        return "Digests arrive as things happen."
    paused_until = subscriber["paused_until"]
    if paused_until is not None and paused_until > slot:
        _, slot = plan.next_slot(paused_until, tz_name, cadence, subscriber["digest_hour"],
                                 subscriber["digest_weekday"])
        return f"Emails are paused; your next digest after that: {when(slot, tz_name)}."
    return f"Your next digest: {when(slot, tz_name)}."
