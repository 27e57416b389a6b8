"""Applying stored SendGrid events: suppressions, soft-bounce counting, per-mail counters.

Runs in a worker (actors/webhooks.py) on ids enqueued after the webhook commit, and again from the
scheduler tick via requeue_unprocessed() for anything Redis lost (Redis is a hint; the
webhook_events row with processed_at NULL is the truth).

Exactly-once effect: the rows are locked (FOR UPDATE SKIP LOCKED, processed_at IS NULL) and marked
processed in the same transaction as their effects, so a redelivered or concurrent message finds
nothing left to do.

Mapping: custom_args come back flattened into each event (mail_kind, mail_id, row_id,
subscriber_id); events without them still suppress by email.

What each event does:
  bounce (type "blocked")           → suppression reason 'block', at once
  bounce (any other type)           → suppression reason 'bounce' (hard bounce), at once
  dropped "Bounced Address" / "Unsubscribed Address" / "Spam Reporting Address"
                                    → 'bounce' / 'unsubscribe' / 'spamreport' (SendGrid's own list)
  spamreport                        → 'spamreport', at once
  unsubscribe, group_unsubscribe    → 'unsubscribe', at once
  deferred                          → a soft bounce: SendGrid could not deliver yet and retries
                                      itself. Counted once per message (the event with attempt
                                      "1", or without an attempt field) in
                                      subscribers.soft_bounce_count; at SOFT_BOUNCE_LIMIT the
                                      address is suppressed with reason 'soft_bounce'.
  delivered                         → soft_bounce_count back to 0 (the limit counts consecutive
                                      trouble, not a lifetime total)
  every event with custom_args      → mail_event_counts(mail_kind, mail_id, event) + 1
Suppressed emails are stored lower-cased.
"""
from __future__ import annotations

import logging
from collections import Counter

import psycopg2
import psycopg2.extras

from app import config, db

log = logging.getLogger("tracking.webhook_apply")

APPLY_CHUNK = 500
REQUEUE_AFTER_SECONDS = 60
REQUEUE_MAX = 20_000
IMMEDIATE_SUPPRESSION = {"spamreport": "spamreport", "unsubscribe": "unsubscribe",
                         "group_unsubscribe": "unsubscribe"}
DROPPED_REASONS = {"bounced address": "bounce", "unsubscribed address": "unsubscribe",
                   "spam reporting address": "spamreport"}
MAIL_KINDS = ("digest", "newsletter")


def _int(value) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if 0 < n < 2 ** 63 else None


def suppression_reason(event: str, payload: dict) -> str | None:
    if event == "bounce":
        return "block" if str(payload.get("type", "")).lower() == "blocked" else "bounce"
    if event == "dropped":
        return DROPPED_REASONS.get(str(payload.get("reason", "")).strip().lower())
    return IMMEDIATE_SUPPRESSION.get(event)


def is_counted_soft_bounce(event: str, payload: dict) -> bool:
    if event != "deferred":
        return False
    attempt = payload.get("attempt")
    return attempt is None or str(attempt).strip() in ("", "1")


def _suppress(cur, email: str | None, reason: str, source: str) -> None:
    if email:
        cur.execute("INSERT INTO suppressions (email, reason, source) VALUES (lower(%s), %s, %s) "
                    "ON CONFLICT (email) DO NOTHING", (email.strip(), reason, source))


def _subscriber_filter(subscriber_id: int | None, email: str | None) -> tuple[str, tuple] | None:
    if subscriber_id:
        return "id = %s", (subscriber_id,)
    if email:
        return "lower(email) = lower(%s)", (email.strip(),)
    return None


def _apply_one(cur, event: str, email: str | None, payload: dict, counts: Counter) -> None:
    mail_kind = payload.get("mail_kind")
    mail_id = _int(payload.get("mail_id"))
    subscriber_id = _int(payload.get("subscriber_id"))
    if mail_kind in MAIL_KINDS and mail_id:
        counts[(mail_kind, mail_id, event)] += 1
    reason = suppression_reason(event, payload)
    if reason:
        _suppress(cur, email, reason, f"sendgrid:{event}")
        return
    where = _subscriber_filter(subscriber_id, email)
    if where is None:
        return
    if is_counted_soft_bounce(event, payload):
        cur.execute(f"UPDATE subscribers SET soft_bounce_count = soft_bounce_count + 1 WHERE {where[0]} "
                    "RETURNING email, soft_bounce_count", where[1])
        for sub_email, n in cur.fetchall():
            if n >= config.get().soft_bounce_limit:
                _suppress(cur, email or sub_email, "soft_bounce", f"sendgrid:deferred x{n}")
    elif event == "delivered":
        cur.execute(f"UPDATE subscribers SET soft_bounce_count = 0 WHERE {where[0]} AND soft_bounce_count > 0",
                    where[1])


def apply_events(ids: list[int]) -> int:
    """Apply the stored events with these ids that are not processed yet; returns how many."""
    ids = sorted({int(i) for i in ids})
    done = 0
    for start in range(0, len(ids), APPLY_CHUNK):
        done += _apply_chunk(ids[start:start + APPLY_CHUNK])
    return done


def _apply_chunk(ids: list[int]) -> int:
    with db.raw_cursor() as cur:
        cur.execute("SELECT id, event, email, payload FROM webhook_events WHERE id = ANY(%s) "
                    "AND processed_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED", (ids,))
        rows = cur.fetchall()
        counts: Counter = Counter()
        errors: dict[int, str] = {}
        for row_id, event, email, payload in rows:
            if not isinstance(payload, dict):
                errors[row_id] = "payload is not a JSON object"
                continue
            cur.execute("SAVEPOINT one_event")
            one: Counter = Counter()  # merged only if this event's effects stand
            try:
                _apply_one(cur, event, email, payload, one)
            except (psycopg2.DataError, psycopg2.IntegrityError) as exc:
                # This event's data cannot be applied (e.g. an absurd email): record why and move
                # on; retrying would fail the same way forever. Connection/lock errors propagate
                # and the whole chunk is retried by the actor.
                cur.execute("ROLLBACK TO SAVEPOINT one_event")
                errors[row_id] = f"{exc.__class__.__name__}: {str(exc).strip()[:500]}"
                log.warning("webhook event %s not applied: %s", row_id, errors[row_id])
            else:
                cur.execute("RELEASE SAVEPOINT one_event")
                counts.update(one)
        for (kind, mail_id, event), n in sorted(counts.items()):
            cur.execute("INSERT INTO mail_event_counts (mail_kind, mail_id, event, count) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT (mail_kind, mail_id, event) DO UPDATE "
                        "SET count = mail_event_counts.count + EXCLUDED.count, updated_at = now()",
                        (kind, mail_id, event, n))
        if rows:
            cur.execute("UPDATE webhook_events SET processed_at = now(), error = (%s::jsonb ->> id::text) "
                        "WHERE id = ANY(%s)", (psycopg2.extras.Json({str(k): v for k, v in errors.items()}),
                                               [r[0] for r in rows]))
    return len(rows)


def enqueue(ids: list[int]) -> None:
    """Hint the worker; a failure here loses nothing (requeue_unprocessed finds the rows)."""
    try:
        from actors.webhooks import apply_webhook_events

        for start in range(0, len(ids), APPLY_CHUNK):
            apply_webhook_events.send(ids[start:start + APPLY_CHUNK])
    except Exception as exc:
        log.warning("could not enqueue %d webhook events (the scheduler will): %s", len(ids), exc)


def requeue_unprocessed() -> int:
    """Scheduler tick: re-enqueue stored events still unprocessed a minute after they arrived."""
    rows = db.query("SELECT id FROM webhook_events WHERE processed_at IS NULL "
                    "AND received_at < now() - make_interval(secs => %s) ORDER BY id LIMIT %s",
                    (REQUEUE_AFTER_SECONDS, REQUEUE_MAX))
    ids = [r[0] for r in rows]
    if ids:
        log.info("re-enqueueing %d unprocessed webhook events", len(ids))
        enqueue(ids)
    return len(ids)

