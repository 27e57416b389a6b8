"""Mailgun webhooks: the signature, each token once, and each event as a stored webhook row.

Mailgun puts its signature in the body: `signature: {timestamp, token, signature}`, where
signature = hex(HMAC-SHA256(MAILGUN_WEBHOOK_SIGNING_KEY, timestamp + token)). `verify` refuses
(MailgunError, 403) a timestamp more than MAILGUN_WEBHOOK_MAX_AGE_SECONDS away from now (either
direction), a signature that does not match (compared in constant time), and then a token already
accepted once.

Used tokens live in Redis (SET NX with an expiry of the maximum age), not in Postgres: the age bound
refuses any older token by itself, so a token only needs remembering for that long, which is what a
Redis expiry does without a cleanup job, and every web process shares it; it keeps a write per
request off the webhook's Postgres path (the rows go through the group commit). If Redis does not
answer, the request is refused with 503 (Mailgun retries for hours), never accepted unchecked.
Redis losing its keys (a flush) would let a captured request be replayed within the age bound; the
replay only re-delivers an event already stored under its `mailgun:<event-data.id>`, which the
intake stores once. A token is given back (`release`) when its events could not be committed, so
Mailgun's retry of the same request is not refused as a replay.

The vocabulary is tracking/webhook_apply.py's (`event-data.event`):
  failed, severity permanent → bounce (suppressed); reason suppress-complaint → spamreport,
      suppress-unsubscribe → unsubscribe, espblock → bounce type blocked (Mailgun's own lists say why)
  failed, severity temporary → deferred (Mailgun retries itself; counted once per message, by
      delivery-status.attempt-no)
  complained → spamreport; unsubscribed → unsubscribe; delivered; opened → open; clicked → click;
  accepted → processed; rejected → dropped.
The mail is found by `message.headers.message-id` (angle brackets dropped), what the Mailgun provider
records as provider_message_id; one batch send shares it, so the event's `recipient` decides the row.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import redis as redis_lib

from app.platform import queue
from app.platform.validation import plain_int
from tracking import webhook_intake

MAX_TOKEN_LENGTH = 256
TOKEN_KEY = "notify:mailgun:token:"
NAMES = {
    "complained": "spamreport",
    "unsubscribed": "unsubscribe",
    "delivered": "delivered",
    "opened": "open",
    "clicked": "click",
    "accepted": "processed",
    "rejected": "dropped",
}
PERMANENT_REASONS = {"suppress-complaint": "spamreport", "suppress-unsubscribe": "unsubscribe"}


class MailgunError(Exception):
    """Why a request is refused (403); the text is safe to return."""


class TokensUnavailable(Exception):
    """Redis did not answer: whether the token was used cannot be known (503)."""


class Unusable(ValueError):
    """The body is not a Mailgun webhook (400)."""


def _signature(body: dict) -> tuple[str, str, str]:
    signed = body.get("signature")
    if not isinstance(signed, dict):
        raise MailgunError("signature is missing")
    timestamp, token, signature = (signed.get(k) for k in ("timestamp", "token", "signature"))
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        timestamp = str(timestamp)
    if not all(isinstance(v, str) and v for v in (timestamp, token, signature)):
        raise MailgunError("signature needs timestamp, token and signature")
    return timestamp, token, signature  # type: ignore[return-value]


def verify(body: object, signing_key: str, max_age_seconds: int, now: float | None = None) -> str:
    """The request's token, if the signature is Mailgun's and fresh; MailgunError otherwise. The
    token is not yet marked used: `claim_token` does that."""
    if not isinstance(body, dict):
        raise Unusable("body must be a JSON object")
    timestamp, token, signature = _signature(body)
    seconds = plain_int(timestamp, 12)
    if seconds is None:
        raise MailgunError("timestamp is not a unix time")
    if abs((time.time() if now is None else now) - seconds) > max_age_seconds:
        raise MailgunError("timestamp outside the accepted window")
    if len(token) > MAX_TOKEN_LENGTH:
        raise MailgunError("token too long")
    expected = hmac.new(signing_key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a refusal).
    if not hmac.compare_digest(expected.encode(), signature.strip().lower().encode()):
        raise MailgunError("signature does not match")
    return token


def _key(token: str) -> str:
    return TOKEN_KEY + hashlib.sha256(token.encode()).hexdigest()[:40]


def claim_token(token: str, max_age_seconds: int) -> None:
    """Mark a verified token used; MailgunError if it was already, TokensUnavailable without Redis."""
    try:
        fresh = queue.broker().client.set(_key(token), b"1", nx=True, ex=max(int(max_age_seconds), 1))
    except redis_lib.RedisError as exc:
        raise TokensUnavailable(str(exc)) from None
    if not fresh:
        raise MailgunError("token already used (a replayed request)")


def release(token: str) -> None:
    """Give a claimed token back: its request was answered 5xx, so Mailgun may send it again."""
    try:
        queue.broker().client.delete(_key(token))
    except redis_lib.RedisError:
        pass  # the retry is then refused as a replay until the token expires: Mailgun keeps retrying


def _message_id(event: dict) -> str | None:
    message = event.get("message")
    headers = message.get("headers") if isinstance(message, dict) else None
    value = headers.get("message-id") if isinstance(headers, dict) else None
    return value.strip().strip("<>") if isinstance(value, str) and value.strip() else None


def rows_from_body(body: dict) -> list[tuple]:
    """The row of the verified request's event ([] for an event not applied here)."""
    event = body.get("event-data")
    if not isinstance(event, dict):
        raise Unusable("event-data is missing")
    kind = event.get("event")
    payload: dict = {"provider": "mailgun", "message_id": _message_id(event)}
    if kind == "failed":
        if event.get("severity") == "temporary":
            name = "deferred"
            status = event.get("delivery-status")
            attempt = status.get("attempt-no") if isinstance(status, dict) else None
            if isinstance(attempt, int | str):
                payload["attempt"] = str(attempt)
        else:
            reason = event.get("reason")
            name = PERMANENT_REASONS.get(reason, "bounce") if isinstance(reason, str) else "bounce"
            if reason == "espblock":
                payload["type"] = "blocked"
    elif isinstance(kind, str) and kind in NAMES:
        name = NAMES[kind]
    else:
        return []
    if kind == "clicked" and isinstance(event.get("url"), str):
        payload["url"] = event["url"]
    payload["raw"] = event
    event_id = event.get("id")
    if isinstance(event_id, str) and event_id:
        event_id = f"mailgun:{event_id}"
    else:
        event_id = webhook_intake.content_id("mailgun:sha256:", event)
    recipient = event.get("recipient")
    return [webhook_intake.row(event_id, name, recipient if isinstance(recipient, str) else None, payload)]
