"""Time zones: the one list of names a subscriber may choose and the one way to load a stored name.

A name is valid when it is one of the zones the running Python knows (`zoneinfo.available_timezones()`:
the system's tz database and the `tzdata` package) and actually loads. Asking `ZoneInfo` alone is not
a check: "Europe" is a directory of the database, and `ZoneInfo("Europe")` raises IsADirectoryError
(an OSError, not the ZoneInfoNotFoundError callers expect); "right/UTC" loads, but counts leap seconds
and is no zone a person lives in. `localtime` is the host's own setting, not an IANA name, so it
is left out too.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from zoneinfo import ZoneInfo, available_timezones

log = logging.getLogger("app.platform.timezones")

_NOT_A_ZONE = {"localtime"}


def _loads(name: str) -> bool:
    try:
        ZoneInfo(name)
        return True
    except Exception:
        return False


@lru_cache(maxsize=1)
def names() -> frozenset[str]:
    """Every zone name a subscriber may have: known to this Python and loadable."""
    return frozenset(n for n in available_timezones() - _NOT_A_ZONE if _loads(n))


def valid(name: object) -> bool:
    return isinstance(name, str) and name in names()


def load(name: str | None) -> ZoneInfo:
    """The zone of a stored name; UTC (with a warning) for a name this Python cannot load, so a row
    written under another tz database never stops a digest or a page."""
    if valid(name or "UTC"):
        return ZoneInfo(name or "UTC")
    log.warning("time zone %r is not one this Python can load; using UTC", name)
    return ZoneInfo("UTC")
