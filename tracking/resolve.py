"""Code → redirect target, with in-process caches so the click path does no DB round trip.

email_links rows never change once written (one row per (mail, url), the URL is part of its
identity) and legacy codes are imported once, so both are cached in process for the life of the
process, bounded in size. Only a first sighting in this process costs one query, run in the
threadpool; concurrent first sightings of one link share that query.

Junk is refused as cheaply as possible: a versioned code is MAC-checked before anything else, a
string that cannot be a legacy code (tracking/codes.py LEGACY_CODE_RE) never reaches the database,
and what was looked up and not found (a legacy-shaped code, or a verified code whose link row is
gone) is remembered as missing for a minute in a bounded cache: after the first sighting, the same
junk costs no query at all.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool

from app.platform import db
from app.platform.negcache import NegativeCache
from tracking import codes

MAX_CACHED_LINKS = 500_000
MAX_CACHED_LEGACY = 500_000
MAX_CACHED_MISSING = 200_000
MISSING_TTL_SECONDS = 60.0
MAX_LINK_ID = 2**63 - 1  # email_links.id is a bigint; a larger id cannot exist
LOOKUP_CONCURRENCY = 4
# Everything printable that may appear in a URL stays as is; non-ASCII, spaces, CR/LF are escaped,
# so a Location header can neither fail to encode nor be split.
_LOCATION_SAFE = "!#$%&'()*+,/:;=?@[]~-._"


class Link(NamedTuple):
    id: int
    location: bytes  # the URL, escaped to ASCII: a Location header value ready to send
    mail_kind: str
    mail_id: int


class Target(NamedTuple):
    link: Link
    subscriber_id: int | None


_links: dict[int, Link | None] = {}
_legacy: dict[str, tuple[int, int | None]] = {}
_missing = NegativeCache(MAX_CACHED_MISSING, MISSING_TTL_SECONDS)  # legacy code or ("link", id)
_inflight: dict[object, asyncio.Future] = {}


def clear_caches() -> None:
    """Tests only: the DB is truncated between tests, ids are reused."""
    _links.clear()
    _legacy.clear()
    _missing.clear()


def _remember(cache: dict, key, value, limit: int) -> None:
    if len(cache) >= limit:
        cache.clear()  # crude but bounded; the working set refills from the DB in a few queries
    cache[key] = value


def _load_link(link_id: int) -> Link | None:
    rows = db.query("SELECT id, url, mail_kind, mail_id FROM email_links WHERE id = %s", (link_id,))
    if not rows:
        return None
    lid, url, kind, mail_id = rows[0]
    return Link(lid, quote(url, safe=_LOCATION_SAFE).encode("ascii"), kind, mail_id)


def _load_legacy(code: str) -> tuple[int, int | None] | None:
    rows = db.query("SELECT link_id, subscriber_id FROM legacy_link_codes WHERE code = %s", (code,))
    return (rows[0][0], rows[0][1]) if rows else None


_slots: asyncio.Semaphore | None = None
_slots_loop = None


def _lookup_slots() -> asyncio.Semaphore:
    """Cold-cache lookups share the DB pool with the rest of the process (the pool raises rather
    than waits when exhausted): at most LOOKUP_CONCURRENCY at a time, the rest queue here."""
    global _slots, _slots_loop
    loop = asyncio.get_running_loop()
    if _slots is None or _slots_loop is not loop:
        _slots, _slots_loop = asyncio.Semaphore(LOOKUP_CONCURRENCY), loop
    return _slots


async def _shared(key, fn, *args):
    """Run fn(*args) in the threadpool once for all concurrent callers with the same key."""
    fut = _inflight.get(key)
    if fut is not None:
        return await asyncio.shield(fut)
    fut = asyncio.get_running_loop().create_future()
    _inflight[key] = fut
    try:
        async with _lookup_slots():
            result = await run_in_threadpool(fn, *args)
        fut.set_result(result)
        return result
    except BaseException as exc:
        fut.set_exception(exc)
        fut.exception()  # mark retrieved: waiters (if any) re-raise it, no "never retrieved" warning
        raise
    finally:
        del _inflight[key]


async def link(link_id: int) -> Link | None:
    cached = _links.get(link_id)
    if cached is not None:
        return cached
    key = ("link", link_id)
    if key in _missing or not 0 < link_id <= MAX_LINK_ID:
        return None
    found = await _shared(key, _load_link, link_id)
    if found is None:
        _missing.add(key)
    else:
        _remember(_links, link_id, found, MAX_CACHED_LINKS)
    return found


async def click_target(code: str) -> Target | None:
    """Where a click code leads: a versioned code (MAC-checked, no DB) or a legacy code (one lookup,
    then cached). None: not ours, forged, or unknown → the caller answers 404, never a redirect."""
    decoded = codes.decode_click(code)
    if decoded is not None:
        found = await link(decoded.link_id)
        return Target(found, decoded.subscriber_id) if found else None
    legacy = _legacy.get(code)
    if legacy is None:
        if code in _missing or not codes.is_legacy_shaped(code):
            return None
        legacy = await _shared(("legacy", code), _load_legacy, code)
        if legacy is None:
            _missing.add(code)
            return None
        _remember(_legacy, code, legacy, MAX_CACHED_LEGACY)
    found = await link(legacy[0])
    return Target(found, legacy[1]) if found else None
