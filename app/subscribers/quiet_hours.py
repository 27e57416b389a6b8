"""Quiet hours: the part of a subscriber's day when no mail should arrive (issue 40).

A window is two wall-clock times in the subscriber's own zone, `start` and `end` ("22:00"–"07:00");
it may cross midnight, and `start == end` is no window (refused where it is set). A subscriber's
own window wins; without one, DEFAULT_QUIET_HOURS applies (empty, the shipped default: none).

`held_until(now, zone, window)` is the one answer the senders need: when the window that holds
`now` ends, or None outside it. DST-safe: the end is a wall-clock time on the right local date; an
end that falls in a skipped hour (spring forward) is the first valid minute after the gap, an end
in a repeated hour (fall back) its first occurrence (its second when `now` is already past the
first); `now` itself is read as the wall clock shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

from app.platform import timezones

_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


class QuietHoursError(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    start: time
    end: time

    def contains(self, wall: time) -> bool:
        """Is this wall-clock time inside the window (start included, end not)?"""
        if self.start < self.end:
            return self.start <= wall < self.end
        return wall >= self.start or wall < self.end  # crosses midnight

    def as_dict(self) -> dict[str, str]:
        return {"start": self.start.strftime("%H:%M"), "end": self.end.strftime("%H:%M")}


def clock(text: object, name: str = "time") -> time:
    """ "07:00" -> time(7, 0); QuietHoursError naming `name` for anything else."""
    match = _HHMM.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise QuietHoursError(f"{name} must be a time as HH:MM (00:00 to 23:59)")
    return time(int(match[1]), int(match[2]))


def window(start: object, end: object) -> Window:
    found = Window(clock(start, "start"), clock(end, "end"))
    if found.start == found.end:
        raise QuietHoursError("start and end must differ (a window of no length is no window)")
    return found


def parse_setting(text: str) -> Window | None:
    """DEFAULT_QUIET_HOURS: "22:00-07:00", or empty for none."""
    text = text.strip()
    if not text:
        return None
    start, sep, end = text.partition("-")
    if not sep:
        raise QuietHoursError("must be START-END as HH:MM-HH:MM, e.g. 22:00-07:00, or empty")
    return window(start.strip(), end.strip())


def as_setting(found: Window) -> str:
    """The stored and configured form: "22:00-07:00" (parse_setting reads it back)."""
    return f"{found.start:%H:%M}-{found.end:%H:%M}"


def _exists(wall: datetime, zone: tzinfo) -> bool:
    """Does this wall-clock time exist in the zone (not inside a spring-forward gap)?"""
    back = wall.replace(tzinfo=zone).astimezone(UTC).astimezone(zone)
    return back.replace(tzinfo=None) == wall


def at_wall_clock(day: date, wall: time, zone: tzinfo) -> datetime:
    """The moment the zone's clocks show `wall` on `day`: its first occurrence when the hour repeats,
    the first valid minute after the gap when the hour is skipped."""
    naive = datetime.combine(day, wall)
    for _ in range(24 * 60):  # a gap is an hour, at most a day (zones that skipped a date)
        if _exists(naive, zone):
            return naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
        naive = naive.replace(second=0, microsecond=0) + timedelta(minutes=1)
    raise ValueError(f"no valid wall-clock time after {day} {wall} in {zone}")


def held_until(now: datetime, zone: tzinfo, found: Window | None) -> datetime | None:
    """When the quiet window holding `now` ends (UTC), or None when `now` is outside it (or there is
    no window)."""
    if found is None:
        return None
    local = now.astimezone(zone)
    wall = local.time().replace(tzinfo=None)
    if not found.contains(wall):
        return None
    day = local.date()
    if found.start > found.end and wall >= found.start:  # before midnight: it ends tomorrow
        day += timedelta(days=1)
    end = at_wall_clock(day, found.end, zone)
    if end <= now:  # `now` is the repeated hour's second pass and the end its first: the second one
        end = datetime.combine(day, found.end).replace(tzinfo=zone, fold=1).astimezone(UTC)
    return end


def subscriber_held_until(now: datetime, zone_name: str, stored: str | None, default: Window | None) -> datetime | None:
    """`held_until` for a subscriber's row: their stored window ("22:00-07:00"), else `default`
    (DEFAULT_QUIET_HOURS, parsed once by the caller), in their stored zone."""
    found = parse_setting(stored) if stored else default
    if found is None:
        return None
    return held_until(now, timezones.load(zone_name), found)
