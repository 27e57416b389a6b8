"""Seen and read state of a subscriber's feed: the one owner of `feed_state` and `feed_state_all`.

Two states, as feed users know them: *seen* (shown on screen) and *read* (opened or marked; read
implies seen). Per subscriber and entity (entity_type, entity_id) the time up to which its events
have been seen / read; "mark all" is one row of feed_state_all. An event is unseen when it occurred
after greatest(its entity's seen_until, the subscriber's all-row seen_until); the same for read.

Marking is one statement whatever the number of entities (1-1000), idempotent (a mark never moves a
time backwards: greatest()), and every write keeps seen_until >= read_until. The digest reads the
state of a batch's subscribers in one statement (load) and leaves seen events out (digest/build.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal, cast

from pydantic import ConfigDict, Field

from app.platform import config, db
from app.platform.validation import NOT_BLANK, Body, Text, check, documented
from digest.group import Digest, Event
from digest.group import build as build_groups
from digest.ingest import _parse_time as parse_time

SEEN, READ = "seen", "read"
KINDS = (SEEN, READ)

# EXCLUDED.read_until is NULL for a "seen" mark: greatest() ignores NULLs, so reading stays as it was.
_MARK_ENTITIES = """
INSERT INTO feed_state (subscriber_id, entity_type, entity_id, seen_until, read_until)
SELECT %(sid)s, t, i, %(at)s, CASE WHEN %(read)s THEN %(at)s::timestamptz END
FROM unnest(%(types)s::text[], %(ids)s::text[]) AS m(t, i)
ON CONFLICT (subscriber_id, entity_type, entity_id) DO UPDATE
    SET seen_until = greatest(feed_state.seen_until, EXCLUDED.seen_until),
        read_until = greatest(feed_state.read_until, EXCLUDED.read_until),
        updated_at = now()
"""

_MARK_ALL = """
INSERT INTO feed_state_all (subscriber_id, seen_until, read_until)
VALUES (%(sid)s, %(at)s, CASE WHEN %(read)s THEN %(at)s::timestamptz END)
ON CONFLICT (subscriber_id) DO UPDATE
    SET seen_until = greatest(feed_state_all.seen_until, EXCLUDED.seen_until),
        read_until = greatest(feed_state_all.read_until, EXCLUDED.read_until),
        updated_at = now()
"""

_LOAD = """
SELECT subscriber_id, entity_type, entity_id, seen_until, read_until
FROM feed_state WHERE subscriber_id = ANY (%(sids)s)
UNION ALL
SELECT subscriber_id, NULL, NULL, seen_until, read_until
FROM feed_state_all WHERE subscriber_id = ANY (%(sids)s)
"""

# Entity rows the all-row now covers say nothing more (same transaction as the mark: one
# subscriber's rows, by its primary key's prefix).
_DROP_COVERED = """
DELETE FROM feed_state f USING feed_state_all a
WHERE f.subscriber_id = %(sid)s AND a.subscriber_id = %(sid)s AND f.seen_until <= a.seen_until
  AND (f.read_until IS NULL OR f.read_until <= a.read_until)
"""

# Rows not touched for RETENTION_DAYS go: the events they covered went with their partitions.
_PRUNE = """
WITH old AS (
    DELETE FROM feed_state WHERE updated_at < now() - make_interval(days => %(days)s) RETURNING 1
), old_all AS (
    DELETE FROM feed_state_all WHERE updated_at < now() - make_interval(days => %(days)s) RETURNING 1
)
SELECT (SELECT count(*) FROM old) + (SELECT count(*) FROM old_all)
"""


def mark(cur, subscriber_id: int, kind: str, at: datetime, entities: list[tuple[str, str]] | None) -> None:
    """Mark `entities` [(entity_type, entity_id)] — or, None, everything — seen or read up to `at`."""
    if kind not in KINDS:
        raise ValueError(f"unknown mark {kind!r}")
    params = {"sid": subscriber_id, "at": at, "read": kind == READ}
    if entities is None:
        cur.execute(_MARK_ALL, params)
        cur.execute(_DROP_COVERED, params)
        return
    # Sorted and distinct: one row is updated once per statement, and two marks lock in one order.
    keys = sorted(set(entities))
    cur.execute(_MARK_ENTITIES, {**params, "types": [t for t, _ in keys], "ids": [i for _, i in keys]})


@dataclass
class Marks:
    """One subscriber's state."""

    seen_all: datetime | None = None
    read_all: datetime | None = None
    entities: dict = field(default_factory=dict)  # (entity_type, entity_id) -> (seen_until, read_until)

    def seen_until(self, key: tuple) -> datetime | None:
        own = self.entities.get(key)
        return _latest(own[0] if own else None, self.seen_all)

    def read_until(self, key: tuple) -> datetime | None:
        own = self.entities.get(key)
        return _latest(own[1] if own else None, self.read_all)


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


def load(cur, subscriber_ids: list[int]) -> dict[int, Marks]:
    """{subscriber_id: Marks} for those of `subscriber_ids` with any state (one statement)."""
    out: dict[int, Marks] = {}
    if not subscriber_ids:
        return out
    cur.execute(_LOAD, {"sids": list(subscriber_ids)})
    for sid, etype, eid, seen_until, read_until in cur.fetchall():
        marks = out.get(sid)
        if marks is None:
            marks = out[sid] = Marks()
        if etype is None:
            marks.seen_all, marks.read_all = seen_until, read_until
        else:
            marks.entities[(etype, eid)] = (seen_until, read_until)
    return out


def unseen(events: list[Event], marks: Marks | None) -> list[Event]:
    """The events that occurred after their entity was last seen (all of them without any state)."""
    if marks is None:
        return events
    seen_all, entities = marks.seen_all, marks.entities
    if not entities:
        return events if seen_all is None else [ev for ev in events if ev.occurred_at > seen_all]
    out = []
    for ev in events:
        until = seen_all
        own = entities.get((ev.entity_type, ev.entity_id))
        if own is not None and (until is None or own[0] > until):
            until = own[0]
        if until is None or ev.occurred_at > until:
            out.append(ev)
    return out


def as_of(marks: Marks | None, when: datetime) -> Marks | None:
    """The marks as they stood at `when`, as far as they tell: a mark whose time is after `when` was
    made later (its earlier value is not kept), so it is left out. Exact for a hosted copy unless
    the entity was marked again after the send (digest/hosted.py)."""
    if marks is None:
        return None
    out = Marks(
        marks.seen_all if marks.seen_all is not None and marks.seen_all <= when else None,
        marks.read_all if marks.read_all is not None and marks.read_all <= when else None,
    )
    out.entities = {k: v for k, v in marks.entities.items() if v[0] <= when}
    return out


def prune(cur, retention_days: int) -> int:
    """Retention of the state (a scheduler hook): rows untouched for `retention_days` (0: keep
    everything). Returns the rows deleted."""
    if retention_days <= 0:
        return 0
    cur.execute(_PRUNE, {"days": retention_days})
    return cur.fetchone()[0]


# -- marking from the API (POST /v1/subscribers/{user_id}/seen|read, POST /v1/feed/seen|read) ----
MAX_ENTITIES = 1000


class EntityRef(Body):
    entity_type: Text(100, NOT_BLANK, min_length=1)
    entity_id: Text(200, NOT_BLANK, min_length=1)


class MarkInput(Body):
    """`entities` (1-1000) or `"all": true`; `read_at` is when it was seen or read (default now)."""

    # Exactly one of the two (validate_mark checks it; the schema says it).
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["entities"]}, {"required": ["all"]}]})

    # Absent by default but never null: the schema must not offer null (hence the ignores).
    entities: Annotated[
        list[EntityRef], Field(min_length=1, max_length=MAX_ENTITIES, description="the entities to mark")
    ] = None  # type: ignore[assignment]
    all: Annotated[Literal[True], Field(description="true: everything up to read_at (one row)")] = None  # type: ignore[assignment]
    read_at: Annotated[
        str,
        *documented({"format": "date-time", "description": "RFC 3339 with offset; default: now"}, parse_time),
    ] = None  # type: ignore[assignment]  # a datetime once validated (parse_time)


def validate_mark(body) -> tuple[MarkInput | None, list[dict]]:
    """The mark a request asks for, or the problems, each naming its field."""
    if isinstance(body, dict) and isinstance(body.get("entities"), list) and len(body["entities"]) > MAX_ENTITIES:
        return None, [{"field": "entities", "message": f"must have at most {MAX_ENTITIES} items"}]
    value, errors = check(MarkInput, body, batch_key="entities")
    if errors:
        return None, errors
    if (value.entities is None) == (value.all is None):
        field_name = "all" if value.all else "entities"
        return None, [{"field": field_name, "message": 'give either "entities" or "all": true, not both or neither'}]
    return value, []


def mark_user(user_id: str | None, kind: str, request: MarkInput, subscriber_id: int | None = None) -> bool:
    """Apply a validated mark to the subscriber named by user_id (or id), in one transaction.
    False: no such subscriber (nothing written)."""
    entities = None if request.all else [(e.entity_type, e.entity_id) for e in request.entities]
    with db.raw_cursor() as cur:
        if subscriber_id is None:
            cur.execute("SELECT id FROM subscribers WHERE user_id = %s", (user_id,))
        else:
            cur.execute("SELECT id FROM subscribers WHERE id = %s", (subscriber_id,))
        row = cur.fetchone()
        if row is None:
            return False
        if request.read_at is None:
            cur.execute("SELECT now()")
            at = cur.fetchone()[0]
        else:
            at = cast(datetime, request.read_at)  # parse_time made it one
        mark(cur, row[0], kind, at, entities)
    return True


def prune_expired() -> int:
    """The scheduler's hook: prune() with RETENTION_DAYS."""
    with db.raw_cursor() as cur:
        return prune(cur, config.get().retention_days)


# -- digests of only what was not seen -------------------------------------------------------------
def build_digest(events: list[Event], marks: Marks | None, max_items: int, recipient: str | None) -> Digest:
    """The digest of the events not seen: seen ones are neither shown nor counted, but they stay in
    `event_ids`, so the run marks them handled and no later digest shows them."""
    shown = unseen(events, marks)
    digest = build_groups(shown, max_items, recipient=recipient)
    if len(shown) < len(events):
        digest.event_ids = [ev.id for ev in events]
        digest.seen_events = len(events) - len(shown)
    return digest
