"""Quiet hours (issue 40): a window of wall-clock times in the subscriber's zone, crossing midnight
or not, and when it ends — across both DST changes in Lisbon, New York and Sydney."""

from __future__ import annotations

from datetime import UTC, datetime, time
from zoneinfo import ZoneInfo

import pytest

from app.subscribers import quiet_hours as qh

pytestmark = pytest.mark.pure

LISBON, NEW_YORK, SYDNEY = ZoneInfo("Europe/Lisbon"), ZoneInfo("America/New_York"), ZoneInfo("Australia/Sydney")


def local(zone, *args, fold=0) -> datetime:
    return datetime(*args, tzinfo=zone, fold=fold).astimezone(UTC)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


NIGHT = qh.window("22:00", "07:00")


@pytest.mark.parametrize(
    "wall,until",
    [
        ((2026, 6, 10, 23, 0), (2026, 6, 11, 6, 0)),  # 07:00 WEST the next morning
        ((2026, 6, 11, 6, 59), (2026, 6, 11, 6, 0)),
        ((2026, 6, 10, 22, 0), (2026, 6, 11, 6, 0)),  # the start is inside
        ((2026, 6, 11, 7, 0), None),  # the end is not
        ((2026, 6, 10, 21, 59), None),
        ((2026, 6, 10, 12, 0), None),
    ],
)
def test_a_window_across_midnight(wall, until):
    assert qh.held_until(local(LISBON, *wall), LISBON, NIGHT) == (utc(*until) if until else None)


def test_a_window_within_a_day_and_no_window():
    lunch = qh.window("12:00", "13:30")
    assert qh.held_until(local(LISBON, 2026, 1, 5, 12, 10), LISBON, lunch) == utc(2026, 1, 5, 13, 30)
    assert qh.held_until(local(LISBON, 2026, 1, 5, 13, 30), LISBON, lunch) is None
    assert qh.held_until(local(LISBON, 2026, 1, 5, 23, 0), LISBON, None) is None


@pytest.mark.parametrize(
    "zone,window,now,until",
    [
        # spring forward: an end in the skipped hour is the first valid minute after it
        (NEW_YORK, ("22:00", "02:30"), local(NEW_YORK, 2026, 3, 7, 23, 0), utc(2026, 3, 8, 7, 0)),  # 03:00 EDT
        (LISBON, ("00:00", "01:30"), local(LISBON, 2026, 3, 29, 0, 45), utc(2026, 3, 29, 1, 0)),  # 02:00 WEST
        (SYDNEY, ("01:00", "02:30"), local(SYDNEY, 2026, 10, 4, 1, 15), utc(2026, 10, 3, 16, 0)),  # 03:00 AEDT
        # an ordinary end on a spring-forward night: the clock says 07:00, an hour less of night
        (LISBON, ("22:00", "07:00"), local(LISBON, 2026, 3, 28, 23, 0), utc(2026, 3, 29, 6, 0)),
        # fall back: an end in the repeated hour is its first occurrence
        (NEW_YORK, ("22:00", "01:30"), local(NEW_YORK, 2026, 10, 31, 23, 0), utc(2026, 11, 1, 5, 30)),  # EDT
        (LISBON, ("23:00", "01:30"), local(LISBON, 2026, 10, 24, 23, 30), utc(2026, 10, 25, 0, 30)),  # WEST
        (SYDNEY, ("22:00", "02:30"), local(SYDNEY, 2026, 4, 4, 23, 0), utc(2026, 4, 4, 15, 30)),  # AEDT
        # ... or its second, when `now` is the repeated hour's second pass, past the first end
        (NEW_YORK, ("01:00", "01:30"), local(NEW_YORK, 2026, 11, 1, 1, 15, fold=1), utc(2026, 11, 1, 6, 30)),
        # an ordinary end on a fall-back night: 07:00 on the clock, an hour more of night
        (NEW_YORK, ("22:00", "07:00"), local(NEW_YORK, 2026, 10, 31, 23, 0), utc(2026, 11, 1, 12, 0)),
        (SYDNEY, ("22:00", "07:00"), local(SYDNEY, 2026, 10, 3, 23, 0), utc(2026, 10, 3, 20, 0)),
    ],
)
def test_windows_across_both_dst_changes(zone, window, now, until):
    found = qh.held_until(now, zone, qh.window(*window))
    assert found == until and found > now


def test_times_and_settings_are_read_strictly():
    assert qh.clock("07:05") == time(7, 5)
    for bad in ("7:05", "24:00", "07:60", "0700", "", None, 7):
        with pytest.raises(qh.QuietHoursError):
            qh.clock(bad)
    with pytest.raises(qh.QuietHoursError, match="differ"):
        qh.window("08:00", "08:00")
    assert qh.parse_setting("22:00-07:00") == NIGHT and qh.parse_setting("  ") is None
    with pytest.raises(qh.QuietHoursError):
        qh.parse_setting("22:00")
    assert NIGHT.as_dict() == {"start": "22:00", "end": "07:00"}
