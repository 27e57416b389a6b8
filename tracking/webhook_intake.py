"""Storing provider events: parse, then INSERT, each provider event id stored once.

SendGrid's batches are parsed here (rows_from_body); Amazon SES (SNS), Postmark and Mailgun events
are turned into the same rows by tracking/ses_events.py, postmark_events.py and mailgun_events.py
(`row`), their ids prefixed with the provider (`ses:`, `postmark:`, `mailgun:`) so no provider's id
can take another's: a SendGrid event claiming such an id is stored under its content hash instead.
webhook_events.sg_event_id holds every provider's id (the column keeps its first provider's name).

SendGrid delivers at least once and retries a batch for 24 h on any non-2xx, so the same events
arrive again, sometimes concurrently; sg_event_id makes each stored exactly once. Events without
an sg_event_id (never seen from SendGrid, but the field is not ours) get a deterministic id from a
hash of their content so redelivery still deduplicates. The key lives in webhook_event_keys
(migration 0520: webhook_events is partitioned by month, and a unique index there could only be
unique per month); the table's trigger skips a row whose key is taken, so RETURNING lists only
the rows stored.

Rows are sorted by sg_event_id inside each insert: two web processes storing overlapping batches
then take the key-index locks in the same order and cannot deadlock each other.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import orjson

from app.platform import config, db, http
from app.platform.groupcommit import GroupCommitWriter, OnFirstUse
from tracking import webhook_apply, webhook_events

log = logging.getLogger("tracking.webhook_intake")

MAX_ID_LENGTH = 200
MAX_EVENT_LENGTH = 100
MAX_EMAIL_LENGTH = 320
# The id prefixes of the other providers' events (webhook_apply.PROVIDERS): never a SendGrid id.
OTHER_PROVIDERS = ("ses:", "postmark:", "mailgun:")


class MalformedBatch(ValueError):
    pass


def rows_from_body(body: bytes) -> list[tuple]:
    """(sg_event_id, event, email, payload json) per event; MalformedBatch if the body is not a
    JSON array of objects (a single object is accepted as a batch of one)."""
    try:
        data = http.parse_json(body)
    except http.JSONBodyError as exc:
        raise MalformedBatch(str(exc)) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise MalformedBatch("body must be a JSON array of event objects")
    rows = []
    for i, event in enumerate(data):
        if not isinstance(event, dict):
            raise MalformedBatch(f"element {i} is not a JSON object")
        payload, event = _without_nul(event)
        sg_id = event.get("sg_event_id")
        if not isinstance(sg_id, str) or not sg_id or len(sg_id) > MAX_ID_LENGTH or sg_id.startswith(OTHER_PROVIDERS):
            sg_id = content_id("sha256:", event)
        name = event.get("event")
        name = name[:MAX_EVENT_LENGTH] if isinstance(name, str) and name else "unknown"
        email = event.get("email")
        email = email[:MAX_EMAIL_LENGTH] if isinstance(email, str) else None
        rows.append((sg_id, name, email, payload.decode()))
    return rows


def _without_nul(event: dict) -> tuple[bytes, dict]:
    """The event as JSON, and the event: Postgres jsonb refuses NUL, so keep the event, lose the NUL."""
    payload = orjson.dumps(event)
    if b"\\u0000" in payload:
        payload = payload.replace(b"\\u0000", b"\\ufffd")
        event = orjson.loads(payload)
    return payload, event


def content_id(prefix: str, event: dict) -> str:
    """A deterministic id for an event its provider gave none: a redelivery still deduplicates."""
    return prefix + hashlib.sha256(orjson.dumps(event, option=orjson.OPT_SORT_KEYS)).hexdigest()


def row(event_id: str, name: str, email: str | None, payload: dict) -> tuple:
    """One stored event of another provider: its prefixed id (a longer one is replaced by its hash,
    keeping the prefix), the event name webhook_apply applies, the address it is about, and the
    payload (the provider's raw event inside)."""
    if len(event_id) > MAX_ID_LENGTH or "\x00" in event_id:
        prefix = event_id.split(":", 1)[0]
        event_id = f"{prefix}:sha256:{hashlib.sha256(event_id.encode(errors='replace')).hexdigest()}"
    # Postgres text refuses NUL as jsonb does: the stored address loses it like the payload's copy.
    email = email[:MAX_EMAIL_LENGTH].replace("\x00", "\ufffd") if isinstance(email, str) and email else None
    return (event_id, name[:MAX_EVENT_LENGTH], email, _without_nul(payload)[0].decode())


@dataclass
class StoreResult:
    stored: int
    duplicates: int
    new_ids: list = field(default_factory=list)


def insert_jobs(cur, jobs: list[list[tuple]]) -> list[StoreResult]:
    """Insert several requests' rows in the caller's transaction. A sg_event_id repeated within the
    group belongs to its first request; the others count it as a duplicate. Each row is stored with
    its address's canonical form (what an erasure finds it by), computed here in the writer thread
    rather than on the event loop."""
    owner: dict[str, int] = {}
    unique = []
    for j, rows in enumerate(jobs):
        for row in rows:
            if row[0] not in owner:
                owner[row[0]] = j
                unique.append(row)
    results = [StoreResult(0, len(rows)) for rows in jobs]
    if not unique:
        return results
    unique.sort(key=lambda r: r[0])
    keyed = [(*row, None if row[2] is None else webhook_apply.address_of(row[2])) for row in unique]
    inserted = db.execute_values(
        cur, webhook_events.INSERT_SQL, keyed, template=webhook_events.INSERT_TEMPLATE, page_size=len(keyed), fetch=True
    )
    for row_id, sg_id in inserted:
        r = results[owner[sg_id]]
        r.stored += 1
        r.duplicates -= 1
        r.new_ids.append(row_id)
    return results


_hints = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-hints")


def _after_commit(jobs, results) -> None:
    """Only now, with the rows committed, hint the worker. Losing this hint loses nothing: the
    scheduler's requeue_unprocessed() picks up rows left unprocessed. Sent from its own thread so
    a slow or hung Redis can never hold up the commits of later webhook deliveries."""
    ids = [i for r in results for i in r.new_ids]
    if ids:
        _hints.submit(webhook_apply.enqueue, ids)


def _new_writer() -> GroupCommitWriter:
    settings = config.get()
    return GroupCommitWriter(
        "webhook-events",
        insert_jobs,
        _after_commit,
        wait_ms=settings.ingest_group_wait_ms,
        max_items=settings.ingest_group_max_events,
    )


writer = OnFirstUse(_new_writer)
