"""Load a subscriber's events no digest has handled (digest/marks.py): oldest first, keyset-paginated,
capped, opt-outs excluded.

Many subscribers are loaded with one query (a LATERAL join takes the first page of each); only
subscribers with more than a page of events are paged further, one query per extra page. Payloads
are not loaded here: grouping does not need them, and only the few display fields of the shown
entities' events are read (load_fields, digest/details.py), so 100,000 unsent events with large
payloads still make a small, fast digest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.platform.db import pg_array
from digest import marks
from digest.group import Event

_COLUMNS = "e.id, e.category, e.entity_type, e.entity_id, e.actor_id, e.actor_name, e.occurred_at, e.high_priority"

# "Not handled yet" is digest/marks.py's definition. Read as of the snapshot the marks were read
# with (a later statement's own snapshot may show more), in (txid, id) order: the order of
# digest_events_pending_idx, so a page is an index range. The subscribers row supplies the opt-outs,
# read at load time so a change made a second ago counts.
_PAGE_SQL = f"""
SELECT v.sid, e.txid::text, {_COLUMNS}
FROM unnest(%(subscriber_ids)s::bigint[], %(marks)s::pg_snapshot[]) AS v(sid, through)
JOIN subscribers s ON s.id = v.sid
CROSS JOIN LATERAL (
    SELECT e.txid, {_COLUMNS} FROM digest_events e
    WHERE e.user_id = s.user_id AND {marks.pending("e", "v.through")}
      AND pg_visible_in_snapshot(e.txid, %(snapshot)s::pg_snapshot)
      AND (e.txid, e.id) > (%(after_txid)s::xid8, %(after_id)s::bigint)
      AND NOT (e.category = ANY (s.category_opt_outs))
    ORDER BY e.txid, e.id
    LIMIT %(page)s
) e
ORDER BY v.sid, e.txid, e.id
"""


# A "send now" run of a daily/weekly/hourly subscriber (digest/immediate.py) loads only the events
# that cannot wait: priority high, or of a category whose delivery is `immediate` — not the critical
# ones, which have a run of their own. A separate statement, so the digest path's query stays as it was.
URGENT = "AND (e.high_priority OR e.category = ANY (%(urgent_categories)s::text[])) AND e.critical IS NOT TRUE"
_URGENT_PAGE_SQL = _PAGE_SQL.replace(
    "ORDER BY e.txid, e.id\n    LIMIT", URGENT + "\n    ORDER BY e.txid, e.id\n    LIMIT"
)
assert _URGENT_PAGE_SQL != _PAGE_SQL
# A critical run (digest/immediate.py) loads only the critical events: they go in a mail of their own.
_CRITICAL_PAGE_SQL = _PAGE_SQL.replace(
    "ORDER BY e.txid, e.id\n    LIMIT", "AND e.critical\n    ORDER BY e.txid, e.id\n    LIMIT"
)
assert _CRITICAL_PAGE_SQL != _PAGE_SQL


@dataclass
class Loaded:
    events: dict[int, list[Event]]  # {subscriber_id: [Event, ...]} oldest first
    # {subscriber_id: what recording the run handles}: their mark moves to the snapshot read as of.
    # Missing for a subscriber whose events are marked one by one (only urgent ones, or capped).
    covers: dict[int, marks.Cover] = field(default_factory=dict)


def load(
    cur,
    subscriber_ids: list[int],
    page_size: int = 1000,
    max_events: int = 100_000,
    urgent_categories: list[str] | None = None,
    critical_only: bool = False,
) -> Loaded:
    """Each subscriber's events no digest has handled, oldest first. At most max_events per
    subscriber: the rest wait for the next digest. `urgent_categories` given: only the events that
    go out now (high priority, or of one of these categories); `critical_only`: only critical ones.
    Either way the events are marked one by one (no cover)."""
    page_size = max(1, page_size)
    out = Loaded({sid: [] for sid in subscriber_ids})
    if not subscriber_ids:
        return out
    snapshot, current = marks.read(cur, subscriber_ids)
    sids = list(out.events)
    base: dict[str, object] = {"snapshot": snapshot}
    sql = _PAGE_SQL
    if urgent_categories is not None:
        sql, base["urgent_categories"] = _URGENT_PAGE_SQL, list(urgent_categories)
    if critical_only:
        sql = _CRITICAL_PAGE_SQL

    def page(ids: list[int], after: tuple[str, int], n: int):
        """The page's rows, read from the cursor one at a time: a batch's rows never exist all at
        once as Python tuples beside the events made from them."""
        cur.execute(
            sql,
            {
                **base,
                "subscriber_ids": pg_array(ids),
                "marks": [current.get(sid) for sid in ids],
                "after_txid": after[0],
                "after_id": after[1],
                "page": n,
            },
        )
        return cur

    last: dict[int, tuple[str, int]] = {}
    # Categories, entity types and ids, actors repeat across a batch's events: each event keeps the
    # batch's one copy of a string, not its own (repeated strings are most of a batch's event memory).
    strings: dict[Any, Any] = {}
    share = strings.setdefault

    def make(r: tuple) -> Event:
        return Event(
            r[2],
            share(r[3], r[3]),
            share(r[4], r[4]),
            share(r[5], r[5]),
            share(r[6], r[6]),
            share(r[7], r[7]),
            r[8],
            r[9],
        )

    for row in page(sids, ("0", 0), min(page_size, max_events)):
        out.events[row[0]].append(make(row))
        last[row[0]] = (row[1], row[2])
    for sid, events in out.events.items():
        # A full page means there may be more: keep paging this subscriber alone.
        while len(events) < max_events and events and len(events) % page_size == 0:
            n = min(page_size, max_events - len(events))
            rows = page([sid], last[sid], n).fetchall()
            events.extend(make(row) for row in rows)
            if rows:
                last[sid] = (rows[-1][1], rows[-1][2])
            if len(rows) < n:
                break
        events.sort(key=lambda e: e.id)  # read in commit-ish (txid) order, shown in arrival order
        if urgent_categories is None and not critical_only and len(events) < max_events:
            out.covers[sid] = marks.Cover(current.get(sid), snapshot)
    return out


def load_unsent(cur, subscriber_ids: list[int], page_size: int = 1000, max_events: int = 100_000) -> dict:
    """{subscriber_id: [Event, ...]}: `load` without what recording would need (preview, baselines)."""
    return load(cur, subscriber_ids, page_size, max_events).events


_FIELD_KEY = re.compile(r"^[a-z_]{1,40}$")


def load_fields(cur, event_ids, keys, any_of=None) -> dict[int, tuple]:
    """{event id: (value of each of `keys`: a string or None)} for the events whose payload has any
    of `any_of` (default: `keys`). String values only: a number or object under a title key is not
    a title."""
    ids = sorted(set(event_ids))
    if not ids or not keys:
        return {}
    assert all(_FIELD_KEY.match(k) for k in keys), keys  # our own constants, inlined in the SQL
    columns = ", ".join(f"CASE WHEN jsonb_typeof(payload -> '{k}') = 'string' THEN payload ->> '{k}' END" for k in keys)
    cur.execute(
        f"SELECT id, {columns} FROM digest_events WHERE id = ANY (%s::bigint[]) AND payload ?| %s",
        (pg_array(ids), list(any_of or keys)),
    )
    return {row[0]: row[1:] for row in cur.fetchall()}
