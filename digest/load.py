"""Load a subscriber's unsent events: oldest first, keyset-paginated, capped, opt-outs excluded.

Many subscribers are loaded with one query (a LATERAL join takes the first page of each); only
subscribers with more than a page of events are paged further, one query per extra page. Payloads
are not loaded here: grouping does not need them, and only the few display fields of the shown
entities' events are read (load_fields, digest/details.py), so 100,000 unsent events with large
payloads still make a small, fast digest.
"""

from __future__ import annotations

import re

from digest.group import Event
from digest.runs import pg_array

_COLUMNS = "e.id, e.category, e.entity_type, e.entity_id, e.actor_id, e.actor_name, e.occurred_at, e.high_priority"

# The subscribers row supplies the opt-outs, read at load time so a change made a second ago counts.
_PAGE_SQL = f"""
SELECT s.id, {_COLUMNS}
FROM subscribers s
CROSS JOIN LATERAL (
    SELECT {_COLUMNS} FROM digest_events e
    WHERE e.user_id = s.user_id AND e.digest_run_id IS NULL AND e.id > %(after)s
      AND NOT (e.category = ANY (s.category_opt_outs))
    ORDER BY e.id
    LIMIT %(page)s
) e
WHERE s.id = ANY (%(subscriber_ids)s)
ORDER BY s.id, e.id
"""


# A "send now" run of a daily/weekly/hourly subscriber (digest/immediate.py) loads only the events
# that cannot wait: priority high, or of a category whose delivery is `immediate`. A separate
# statement, so the digest path's query stays as it was.
URGENT = "AND (e.high_priority OR e.category = ANY (%(urgent_categories)s::text[]))"
_URGENT_PAGE_SQL = _PAGE_SQL.replace("ORDER BY e.id\n    LIMIT", URGENT + "\n    ORDER BY e.id\n    LIMIT")
assert _URGENT_PAGE_SQL != _PAGE_SQL


def load_unsent(
    cur,
    subscriber_ids: list[int],
    page_size: int = 1000,
    max_events: int = 100_000,
    urgent_categories: list[str] | None = None,
) -> dict[int, list[Event]]:
    """{subscriber_id: [Event, ...]} oldest first. At most max_events per subscriber: the rest stay
    unsent (digest_run_id IS NULL) and go into the next digest. `urgent_categories` given: only the
    events that go out now (high priority, or of one of these categories)."""
    page_size = max(1, page_size)
    out: dict[int, list[Event]] = {sid: [] for sid in subscriber_ids}
    if not subscriber_ids:
        return out
    sql, extra = _PAGE_SQL, {}
    if urgent_categories is not None:
        sql, extra = _URGENT_PAGE_SQL, {"urgent_categories": list(urgent_categories)}
    cur.execute(sql, {"after": 0, "page": min(page_size, max_events), "subscriber_ids": list(subscriber_ids), **extra})
    make = Event._make
    for row in cur.fetchall():
        out[row[0]].append(make(row[1:]))
    for sid, events in out.items():
        # A full page means there may be more: keep paging this subscriber alone.
        while len(events) < max_events and events and len(events) % page_size == 0:
            page = min(page_size, max_events - len(events))
            cur.execute(sql, {"after": events[-1].id, "page": page, "subscriber_ids": [sid], **extra})
            rows = cur.fetchall()
            events.extend(make(row[1:]) for row in rows)
            if len(rows) < page:
                break
    return out


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
