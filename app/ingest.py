"""Event ingestion: validation of POST /v1/events bodies and a group-commit writer.

A 202 means the events are committed. To pay one Postgres round trip for many requests instead of
one each, requests hand their validated rows to a group-commit writer (app/groupcommit.py), which
gathers whatever is waiting (up to INGEST_GROUP_MAX_EVENTS, waiting at most INGEST_GROUP_WAIT_MS
for more), inserts it in one transaction and only then resolves every request's future.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone

import orjson
import psycopg2.extras

from app import config
from app.groupcommit import GroupCommitWriter, OnFirstUse

log = logging.getLogger("app.ingest")

EVENT_FIELDS = {
    # name: (required, max length)
    "id": (True, 200),
    "user_id": (True, 200),
    "category": (True, 100),
    "entity_type": (True, 100),
    "entity_id": (True, 200),
    "actor_id": (False, 200),
    "actor_name": (False, 200),
}
ALLOWED_FIELDS = set(EVENT_FIELDS) | {"payload", "occurred_at"}


class BatchShapeError(ValueError):
    """The body is neither one event nor {"events": [...]} of an allowed size."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def events_from_body(body) -> tuple[list, bool]:
    """(events, is_batch). A body with an "events" key is a batch; any other object is one event."""
    if not isinstance(body, dict):
        raise BatchShapeError("body", "expected a JSON object: one event, or {\"events\": [...]}")
    if "events" not in body:
        return [body], False
    extra = set(body) - {"events"}
    if extra:
        raise BatchShapeError(sorted(extra)[0], "a batch body has only the key 'events'")
    events = body["events"]
    if not isinstance(events, list):
        raise BatchShapeError("events", "must be an array of event objects")
    limit = config.get().max_batch_events
    if not events:
        raise BatchShapeError("events", "must contain at least one event")
    if len(events) > limit:
        raise BatchShapeError("events", f"at most {limit} events per request, got {len(events)}")
    return events, True


def _parse_time(value) -> datetime | str:
    """A timezone-aware datetime, or an error message."""
    if not isinstance(value, str):
        return "must be an RFC 3339 timestamp string"
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return "must be an RFC 3339 timestamp, e.g. 2026-11-21T09:30:00Z"
    if parsed.tzinfo is None:
        return "must include a UTC offset or 'Z' (RFC 3339)"
    try:
        # Normalised to UTC here: Postgres rejects offsets past +-15:59 that RFC 3339 allows.
        parsed = parsed.astimezone(timezone.utc)
    except OverflowError:
        return "is out of range"
    return parsed


def validate_event(event, index: int | None, source: str, errors: list) -> tuple | None:
    """A row tuple for digest_events, or None after appending {index, field, message} errors."""
    def err(field, message):
        e = {"field": field, "message": message}
        errors.append({"index": index, **e} if index is not None else e)

    if not isinstance(event, dict):
        err("event", "must be a JSON object")
        return None
    before = len(errors)
    for name in sorted(set(event) - ALLOWED_FIELDS):
        err(name, "unknown field")
    values = {}
    for name, (required, max_len) in EVENT_FIELDS.items():
        value = event.get(name)
        if value is None:
            if required:
                err(name, "is required")
            values[name] = None
            continue
        if not isinstance(value, str):
            err(name, 'must be a string (send numbers as "42")')
            continue
        if required and not value.strip():
            err(name, "must not be empty")
        elif len(value) > max_len:
            err(name, f"must be at most {max_len} characters")
        elif "\x00" in value:
            err(name, "must not contain NUL characters")
        values[name] = value
    payload = event.get("payload", {})
    payload_json = b"{}"
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        err("payload", "must be a JSON object")
    else:
        try:
            payload_json = orjson.dumps(payload)
        except (TypeError, orjson.JSONEncodeError) as exc:
            err("payload", f"cannot be encoded: {exc}")
        else:
            limit = config.get().max_payload_bytes
            if len(payload_json) > limit:
                err("payload", f"must be at most {limit} bytes as JSON, got {len(payload_json)}")
            elif b"\\u0000" in payload_json:
                err("payload", "must not contain NUL characters")
    occurred_at = None
    if event.get("occurred_at") is not None:
        parsed = _parse_time(event["occurred_at"])
        if isinstance(parsed, str):
            err("occurred_at", parsed)
        else:
            occurred_at = parsed
    if len(errors) > before:
        return None
    return (
        source, values["id"], values["user_id"], values["category"], values["entity_type"],
        values["entity_id"], values["actor_id"], values["actor_name"], payload_json.decode(),
        occurred_at,
    )


def validate_batch(events: list, is_batch: bool, source: str) -> tuple[list[tuple], list[dict]]:
    rows, errors = [], []
    for i, event in enumerate(events):
        row = validate_event(event, i if is_batch else None, source, errors)
        if row is not None:
            rows.append(row)
    return rows, errors


@dataclass
class Result:
    accepted: int
    duplicates: int


INSERT_SQL = (
    "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
    "actor_id, actor_name, payload, occurred_at) VALUES %s "
    "ON CONFLICT (source, producer_id) DO NOTHING RETURNING source, producer_id"
)
INSERT_TEMPLATE = "(%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, COALESCE(%s::timestamptz, now()))"


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
    inserted = psycopg2.extras.execute_values(
        cur, INSERT_SQL, unique_rows, template=INSERT_TEMPLATE, page_size=len(unique_rows) or 1, fetch=True
    )
    accepted = [0] * len(jobs)
    for key in inserted:
        accepted[owner[tuple(key)]] += 1
    return [Result(accepted[j], len(rows) - accepted[j]) for j, rows in enumerate(jobs)]


def new_writer(url: str | None = None) -> GroupCommitWriter:
    settings = config.get()
    return GroupCommitWriter("ingest", insert_rows, url=url, wait_ms=settings.ingest_group_wait_ms,
                             max_items=settings.ingest_group_max_events)


writer = OnFirstUse(new_writer)


def submit(rows: list[tuple]) -> Future:
    """Future of the Result, resolved once the rows are committed."""
    return writer().submit(rows, size=len(rows))
