"""Event ingestion: validation of POST /v1/events bodies and a group-commit writer.

A 202 means the events are committed. To pay one Postgres round trip for many requests instead of
one each, requests hand their validated rows to a group-commit writer (app/platform/groupcommit.py), which
gathers whatever is waiting (up to INGEST_GROUP_MAX_EVENTS, waiting at most INGEST_GROUP_WAIT_MS
for more), inserts it in one transaction and only then resolves every request's future.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

import orjson
from pydantic import AfterValidator, Field

from app.platform import config, db, metrics, queue, urls
from app.platform.groupcommit import GroupCommitWriter, OnFirstUse
from app.platform.openapi import free_form_values
from app.platform.validation import NOT_BLANK, Body, Text, check, documented, fail
from app.subscribers import categories
from digest import events as digest_events
from digest import immediate, messages

log = logging.getLogger("digest.ingest")


def _payload_json(payload: dict | None) -> str:
    """The payload as JSON text for the jsonb column (absent or null: {})."""
    try:
        encoded = orjson.dumps(payload if payload is not None else {})
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise fail("payload_encoding", f"cannot be encoded: {exc}") from None
    limit = config.get().max_payload_bytes
    if len(encoded) > limit:
        raise fail("payload_size", f"must be at most {limit} bytes as JSON, got {len(encoded)}")
    if b"\\u0000" in encoded:
        raise fail("payload_nul", "must not contain NUL characters")  # jsonb cannot hold U+0000
    return encoded.decode()


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise fail("timestamp", "must be an RFC 3339 timestamp, e.g. 2026-11-21T09:30:00Z") from None
    if parsed.tzinfo is None:
        raise fail("timestamp", "must include a UTC offset or 'Z' (RFC 3339)")
    try:
        # Normalised to UTC here: Postgres rejects offsets past +-15:59 that RFC 3339 allows.
        return parsed.astimezone(UTC)
    except OverflowError:
        raise fail("timestamp", "is out of range") from None


def _required(max_length: int, **doc):
    return Text(max_length, NOT_BLANK, min_length=1, **doc)


def _optional(max_length: int):
    return Annotated[Text(max_length) | None, Field(description="null means absent")]


def _url_field(description: str):
    return Annotated[Text(urls.MAX_URL, urls.PATTERN, message=urls.RULE) | None, Field(description=description)]


# What a digest shows about an entity and an actor. Stored in `payload` under the same keys (a
# producer may put them there instead); per field, the newest event of a digest that carries a
# value wins (digest/details.py).
DISPLAY_FIELDS = ("entity_title", "entity_url", "actor_avatar_url")


def _with_display_fields(payload_json: str, fields: dict) -> str:
    payload = orjson.loads(payload_json)
    payload.update(fields)  # the documented field wins over the same key in payload
    return orjson.dumps(payload).decode()


class Event(Body):
    id: _required(200, description="producer's idempotency key")
    user_id: _required(200)
    category: _required(100)
    entity_type: _required(100)
    entity_id: _required(200)
    actor_id: _optional(200) = None
    actor_name: _optional(200) = None
    payload: Annotated[
        dict[str, Any] | None,
        Field(description="at most 16 KiB as JSON; integers within 64 bits", json_schema_extra=free_form_values),
        AfterValidator(_payload_json),
    ] = None
    occurred_at: Annotated[
        str | None,
        *documented({"format": "date-time", "description": "RFC 3339 with offset; default: now"}, _parse_time),
    ] = None
    entity_title: Annotated[
        Text(300) | None, Field(description="the entity's title in digests (default: its type and id)")
    ] = None
    entity_url: _url_field("where the digest links the entity (through click tracking when on)") = None
    actor_avatar_url: _url_field("the actor's picture, shown beside their name") = None
    priority: Annotated[
        Literal["critical", "high", "normal"] | None,
        Field(
            description="`high`: sent now in its own mail to every subscriber who receives "
            "the category (even daily/weekly/hourly ones; rate limited per "
            "subscriber), not held for the digest; quiet hours and the mail budget still apply. "
            "`critical`: for what a person must see now (the product's own security or account "
            "alerts): sent at once in a mail of its own whatever the subscriber's quiet hours, "
            "mail budget or hourly limit. Default `normal`"
        ),
    ] = None

    def row(self, source: str) -> tuple:
        payload = cast(str, self.payload) or "{}"  # made JSON text by _payload_json
        if self.entity_title is not None or self.entity_url is not None or self.actor_avatar_url is not None:
            payload = _with_display_fields(
                payload, {k: v for k in DISPLAY_FIELDS if (v := getattr(self, k)) is not None}
            )
        return (
            source,
            self.id,
            self.user_id,
            self.category,
            self.entity_type,
            self.entity_id,
            self.actor_id,
            self.actor_name,
            payload,
            self.occurred_at,
            True if self.priority in ("high", "critical") else None,
            True if self.priority == "critical" else None,
        )


def _batch_limit(schema: dict) -> None:
    schema["maxItems"] = config.get().max_batch_events


class EventBatch(Body):
    events: Annotated[list[Event], Field(min_length=1, json_schema_extra=_batch_limit)]


def validate_body(body, source: str) -> tuple[list[tuple], list[dict]]:
    """Rows for digest_events from a POST /v1/events body (one event, or {"events": [...]}), or the
    problems: {field, message}, with the event's index inside a batch."""
    if not (isinstance(body, dict) and "events" in body):
        event, errors = check(Event, body)
        return ([event.row(source)] if event else []), errors
    limit = config.get().max_batch_events
    if isinstance(body["events"], list) and len(body["events"]) > limit:
        # Refused before looking at any event: a huge batch costs nothing to reject.
        return [], [{"field": "events", "message": f"at most {limit} events per request, got {len(body['events'])}"}]
    batch, errors = check(EventBatch, body, batch_key="events")
    return ([e.row(source) for e in batch.events] if batch else []), errors


def validate_batch(events: list, is_batch: bool, source: str) -> tuple[list[tuple], list[dict]]:
    return validate_body({"events": events} if is_batch else events[0], source)


@dataclass
class Result:
    accepted: int
    duplicates: int
    send_now: bool = False  # the commit asked for a send-now pass (digest/immediate.py)


def _high(row: tuple) -> bool:
    """Rows are Event.row() tuples; scripts may hand the ten columns without the priority's two."""
    return len(row) > 10 and bool(row[10])


def _critical(row: tuple) -> bool:
    return len(row) > 11 and bool(row[11])


def insert_rows(cur, jobs: list[list[tuple]]) -> list[Result]:
    """Insert several requests' rows in the caller's transaction; per-request accepted/duplicate counts.

    Within the group the first occurrence of a (source, id) owns it, so a key repeated in one
    request, or in two requests that share a commit, is counted as stored exactly once.
    """
    owner: dict[tuple, int] = {}
    unique_rows = []
    for j, rows in enumerate(jobs):
        for row in rows:
            key = (row[0], row[1])
            if key not in owner:
                owner[key] = j
                unique_rows.append(row)
    high = any(_high(row) for row in unique_rows)
    if high:
        sql, template = digest_events.INSERT_HIGH_SQL, digest_events.INSERT_HIGH_TEMPLATE
        values = [(*row[:11], *((None,) * (11 - len(row))), row[11] if len(row) > 11 else None) for row in unique_rows]
    else:
        sql, template = digest_events.INSERT_SQL, digest_events.INSERT_TEMPLATE
        values = [row[:10] for row in unique_rows]
    inserted = db.execute_values(
        cur,
        sql,
        values,
        template=template,
        page_size=len(unique_rows) or 1,
        fetch=True,
    )
    accepted = [0] * len(jobs)
    for key in inserted:
        accepted[owner[tuple(key)]] += 1
    stored = {tuple(key) for key in inserted}
    send_now = _hint_send_now(cur, unique_rows, stored) > 0
    critical = [row[3] for row in unique_rows if _critical(row) and (row[0], row[1]) in stored]
    if critical:
        known = categories.registry(cur)  # the label is a registered category: a bounded set
        metrics.count(metrics.CRITICAL_EVENTS, [c if c in known else "unregistered" for c in critical])
    return [Result(accepted[j], len(rows) - accepted[j], send_now) for j, rows in enumerate(jobs)]


# Who may have something to send now (digest/immediate.py consumes digest_send_now with the runs
# it makes): the users who chose `immediately`, and those of urgent events. Only when there are
# some is anything written (old schemas, during a deploy, never get here: no such subscriber, and
# an urgent event needs this release's column anyway); the mark itself is immediate.mark.
SEND_NOW_WHO = """
SELECT id FROM subscribers
WHERE unsubscribed_at IS NULL
  AND ((user_id = ANY (%(urgent)s::text[]) AND digest_cadence <> 'off')
       OR (user_id = ANY (%(users)s::text[]) AND digest_cadence = 'immediately'))
ORDER BY id
"""


def _hint_send_now(cur, rows: list[tuple], stored: set) -> int:
    """Same transaction as the events: mark for the send-now planner the users who chose
    `immediately` and the users of urgent events (priority high, or a "send now" category as the
    registry says now, cached in process for up to 30 s). One statement per group commit, two when
    there is something to mark."""
    now_categories = set(categories.send_now_keys(categories.registry(cur)))
    users, urgent = set(), set()
    for row in rows:
        if (row[0], row[1]) in stored:
            users.add(row[2])
            if _high(row) or row[3] in now_categories:
                urgent.add(row[2])
    if not users:
        return 0
    cur.execute(SEND_NOW_WHO, {"users": sorted(users), "urgent": sorted(urgent)})
    ids = [row[0] for row in cur.fetchall()]
    if not ids:
        return 0
    return immediate.mark(cur, ids)


def _after_commit(jobs, results) -> None:
    """A hint to the digest workers that something may go out now. Only a hint: the rows in
    digest_send_now are the truth and the scheduler's next tick looks at them anyway."""
    if any(r.send_now for r in results):
        queue.send(messages.SEND_NOW)


def new_writer(url: str | None = None) -> GroupCommitWriter:
    settings = config.get()
    return GroupCommitWriter(
        "ingest",
        insert_rows,
        after_commit=_after_commit,
        url=url,
        wait_ms=settings.ingest_group_wait_ms,
        max_items=settings.ingest_group_max_events,
    )


writer = OnFirstUse(new_writer)


def submit(rows: list[tuple]) -> Future:
    """Future of the Result, resolved once the rows are committed."""
    return writer().submit(rows, size=len(rows))
