"""The in-app feed: one item per entity, newest activity first, grouped and worded by the digest's
own engine (digest/group.py, digest/details.py, digest/context.py), each with its seen/read state.

One page costs two statements on one connection:
  1. per entity of the subscriber (all their events still kept, sent in a digest or not; opted-out
     categories and their own activity left out, as in the digest): its newest activity, from the
     summary the database keeps per entity and category (feed_entities, migration 0680: one row
     each, kept by triggers on digest_events and by retention), joined with the seen/read state
     (digest/seen.py); the unseen and unread counts over every entity, and the page's entities;
  2. the events of the page's entities only (digest_events_feed_idx, migration 0671), grouped and
     worded like a digest, in the subscriber's language (app/platform/i18n.py);
then one statement for the titles, links and avatars of the page (digest/details.py).
So the cost grows with the subscriber's number of entities for step 1 and with the page for the
rest, not with their number of events or the payloads. Between retention detaching a partition
and pruning it (the same scheduler tick, unless the partition is large) an entity whose events
were all in it may still be counted; its item is left out of the page.

An item is unseen when its newest activity is after the entity's seen mark (or the "all" mark);
the badge shows `unseen_count`, the number of such items. Paging is by `next_before`, an opaque
cursor (the last item's newest activity and event id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from pydantic import Field

from app.platform import db, i18n, timezones
from app.platform.validation import Body
from app.subscribers import categories
from digest import context as digest_context
from digest import details as digest_details
from digest import group as digest_group

MAX_LIMIT = 100
DEFAULT_LIMIT = 20
# "<newest activity, Unix microseconds>-<event id>": every string of this shape is a cursor.
CURSOR_PATTERN = "^[0-9]{1,17}-[0-9]{1,18}$"

# %(sid)s names the subscriber; the opt-outs and own activity are the subscriber row's.
_ENTITIES_SQL = """
WITH s AS (
    SELECT id, user_id, category_opt_outs FROM subscribers WHERE id = %(sid)s
), ents AS (
    SELECT f.entity_type, f.entity_id, max(f.latest_at) AS latest_at, max(f.latest_id) AS latest_id
    FROM s JOIN feed_entities f ON f.user_id = s.user_id
    WHERE NOT (f.category = ANY (s.category_opt_outs))
    GROUP BY f.entity_type, f.entity_id
), st AS MATERIALIZED (
    SELECT ents.*, greatest(f.seen_until, a.seen_until) AS seen_until,
           greatest(f.read_until, a.read_until) AS read_until
    FROM ents
    LEFT JOIN feed_state f
           ON f.subscriber_id = %(sid)s AND f.entity_type = ents.entity_type AND f.entity_id = ents.entity_id
    LEFT JOIN feed_state_all a ON a.subscriber_id = %(sid)s
), counts AS (
    SELECT count(*) FILTER (WHERE seen_until IS NULL OR latest_at > seen_until) AS unseen,
           count(*) FILTER (WHERE read_until IS NULL OR latest_at > read_until) AS unread,
           coalesce(max(latest_id), 0) AS newest_id
    FROM st
)
SELECT c.unseen, c.unread, c.newest_id, p.entity_type, p.entity_id, p.latest_at, p.latest_id, p.seen_until, p.read_until
FROM counts c
LEFT JOIN LATERAL (
    SELECT * FROM st
    WHERE (NOT %(unread)s OR read_until IS NULL OR latest_at > read_until)
      AND (%(before_at)s::timestamptz IS NULL OR (latest_at, latest_id) < (%(before_at)s, %(before_id)s))
    ORDER BY latest_at DESC, latest_id DESC
    LIMIT %(limit)s
) p ON true
"""

_EVENTS_SQL = """
SELECT e.id, e.category, e.entity_type, e.entity_id, e.actor_id, e.actor_name, e.occurred_at, e.high_priority
FROM subscribers s
JOIN digest_events e ON e.user_id = s.user_id
JOIN unnest(%(types)s::text[], %(ids)s::text[]) AS k(t, i) ON e.entity_type = k.t AND e.entity_id = k.i
WHERE s.id = %(sid)s AND NOT (e.category = ANY (s.category_opt_outs))
"""


class FeedQuery(Body):
    """GET /v1/subscribers/{user_id}/feed and GET /v1/feed: the query (documented from here; checked
    by the route, which names every bad parameter)."""

    model_config = {**Body.model_config, "strict": False}  # query values arrive as text
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="items per page")] = DEFAULT_LIMIT
    unread: Annotated[Literal["true", "false"] | None, Field(description="true: unread items only")] = None
    before: Annotated[str | None, Field(pattern=CURSOR_PATTERN, description="the previous page's `next_before`")] = None


class BadCursor(ValueError):
    """A `before` cursor this module did not make."""


_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def cursor(latest_at: datetime, latest_id: int) -> str:
    return f"{(latest_at - _EPOCH) // timedelta(microseconds=1)}-{int(latest_id)}"


def parse_cursor(text: str) -> tuple[datetime, int]:
    if not _CURSOR.match(text):
        raise BadCursor("is not a cursor this API returned (use next_before)")
    micros, ident = text.split("-")
    return _EPOCH + timedelta(microseconds=int(micros)), int(ident)  # 17 digits: before year 5200


@dataclass(frozen=True)
class Subscriber:
    id: int
    user_id: str
    timezone: str | None
    token_version: int
    locale: str | None = None  # the words of the items (None: DEFAULT_LOCALE)


_SUBSCRIBER_SQL = "SELECT id, user_id, timezone, token_version, locale FROM subscribers WHERE {} = %s"


def find(user_id: str | None = None, subscriber_id: int | None = None) -> Subscriber | None:
    by, value = ("user_id", user_id) if subscriber_id is None else ("id", subscriber_id)
    rows = db.query(_SUBSCRIBER_SQL.format(by), (value,))
    return Subscriber(*rows[0]) if rows else None


def page(
    subscriber: Subscriber,
    *,
    limit: int = DEFAULT_LIMIT,
    unread_only: bool = False,
    before: tuple[datetime, int] | None = None,
    now: datetime | None = None,
) -> dict:
    """{"unseen_count", "unread_count", "items": [...], "next_before"} of one subscriber's feed."""
    limit = max(1, min(MAX_LIMIT, limit))
    before_at, before_id = before or (None, None)
    with db.raw_cursor() as cur:
        cur.execute(
            _ENTITIES_SQL,
            {
                "sid": subscriber.id,
                "unread": unread_only,
                "before_at": before_at,
                "before_id": before_id,
                "limit": limit,
            },
        )
        rows = cur.fetchall()
        unseen_count, unread_count = (rows[0][0], rows[0][1]) if rows else (0, 0)
        entities = [row[3:] for row in rows if row[3] is not None]
        groups: dict[tuple, digest_group.Group] = {}
        digest = None
        if entities:
            cur.execute(
                _EVENTS_SQL,
                {"sid": subscriber.id, "types": [e[0] for e in entities], "ids": [e[1] for e in entities]},
            )
            events = [digest_group.Event._make(r) for r in cur.fetchall()]
            digest = digest_group.build(events, len(entities), recipient=subscriber.user_id)
            digest_details.resolve(cur, [digest])
            groups = {g.key: g for g in digest.groups}
        registry = categories.registry(cur)
    now = now or datetime.now(UTC)
    tz = timezones.load(subscriber.timezone)
    t = i18n.translator(subscriber.locale)
    items = []
    for entity_type, entity_id, latest_at, latest_id, seen_until, read_until in entities:
        group = groups.get((entity_type, entity_id))
        if group is None or digest is None:  # its events went between the two statements (erasure, retention)
            continue
        item = digest_context.group_item(group, digest, registry, now, tz, t)
        item["latest_at"] = latest_at.astimezone(UTC).isoformat()
        item["latest_event_id"] = latest_id  # what a stream's Last-Event-ID compares with
        item["seen"] = seen_until is not None and latest_at <= seen_until
        item["unread"] = read_until is None or latest_at > read_until
        items.append(item)
    next_before = cursor(entities[-1][2], entities[-1][3]) if len(entities) == limit else None
    return {"unseen_count": unseen_count, "unread_count": unread_count, "items": items, "next_before": next_before}


@dataclass(frozen=True)
class Head:
    """What a feed stream watches: the counts and the newest event shown (0: none)."""

    unseen_count: int
    unread_count: int
    newest_event_id: int


def head(subscriber: Subscriber) -> Head:
    with db.raw_cursor() as cur:
        cur.execute(
            _ENTITIES_SQL, {"sid": subscriber.id, "unread": False, "before_at": None, "before_id": None, "limit": 1}
        )
        rows = cur.fetchall()
    return Head(*rows[0][:3])


# What can change a feed, cheaply (index probes, no aggregation): the newest event (the last entry
# of digest_events_pending_idx: events arrive there and a digest's mark does not take them out), the
# seen/read state, the subscriber row (opt-outs, token version). Streams recompute the head only when
# this changed; one statement for all of a process's open streams.
_FINGERPRINTS_SQL = """
SELECT s.id,
       (SELECT e.txid::text || '/' || e.id FROM digest_events e WHERE e.user_id = s.user_id AND e.digest_run_id IS NULL
        ORDER BY e.txid DESC, e.id DESC LIMIT 1),
       (SELECT max(f.updated_at) FROM feed_state f WHERE f.subscriber_id = s.id),
       (SELECT a.updated_at FROM feed_state_all a WHERE a.subscriber_id = s.id),
       s.updated_at, s.token_version
FROM subscribers s WHERE s.id = ANY (%s)
"""


def fingerprints(subscriber_ids: list[int]) -> dict[int, tuple]:
    """{subscriber id: what changes whenever their feed may have}; a subscriber who is gone is
    missing. Each value's last field is the subscriber's token_version."""
    if not subscriber_ids:
        return {}
    return {row[0]: tuple(row[1:]) for row in db.query(_FINGERPRINTS_SQL, (list(subscriber_ids),))}
