"""POST /webhooks/sendgrid: SendGrid Event Webhook receiver (invariant I4: 2xx means committed).

  403  a public key is configured and the signature/timestamp is missing, wrong or stale
       (outside development a key is required unless SENDGRID_WEBHOOK_ALLOW_UNSIGNED is set to
       the phrase in app/platform/config.py; start-up fails otherwise). Missing, malformed or stale
       headers are refused before the body is read, and the connection is closed: an unsigned
       client costs no body bytes, whatever Content-Length it declares.
  400  the body is not JSON / not an array of event objects (SendGrid will retry it; we log it)
  413  body over SENDGRID_WEBHOOK_MAX_BODY_BYTES
  503  the events could not be committed (database down, ...): SendGrid retries for 24 h
  200  every event of the batch is committed (new ones stored, redeliveries counted as duplicates)

The request waits for a group commit shared with concurrent deliveries (app/platform/groupcommit.py),
so there is no per-request transaction and no threadpool hop. Applying the events (suppressions,
stats) happens afterwards in a worker (actors/webhooks.py), enqueued only after the commit.
Amazon SES, Postmark and Mailgun have routes of their own (app/web/provider_webhooks.py) that
store through `store` here.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel
from starlette.requests import Request

from app.platform import config
from app.platform.http import ApiError, FastJSONResponse, read_body
from app.platform.openapi import Example, Operation, api_route
from tracking import signature, webhook_intake

log = logging.getLogger("app.web.webhooks")
_warned_unsigned = False


def check_config(settings: config.Settings) -> None:
    """Web start-up: a key that cannot be parsed would answer every delivery 500; an unsigned
    webhook outside development was opted into explicitly (app/platform/config.py) and says so loudly."""
    if settings.sendgrid_webhook_public_key:
        try:
            signature.load_public_key(settings.sendgrid_webhook_public_key)
        except ValueError as exc:
            raise config.ConfigError(str(exc)) from None
    elif not settings.is_development and settings.sendgrid_webhook_allow_unsigned:
        log.warning(
            "SENDGRID_WEBHOOK_ALLOW_UNSIGNED is set (APP_ENV=%s): /webhooks/sendgrid accepts "
            "UNSIGNED events, so anyone can suppress addresses and fake statistics. Set "
            "SENDGRID_WEBHOOK_PUBLIC_KEY instead.",
            settings.env,
        )


def _signed_headers(request: Request, settings: config.Settings) -> signature.SignedHeaders:
    try:
        return signature.check_headers(
            request.headers.get(signature.SIGNATURE_HEADER),
            request.headers.get(signature.TIMESTAMP_HEADER),
            settings.sendgrid_webhook_max_age_seconds,
        )
    except signature.SignatureError as exc:
        log.warning("sendgrid webhook refused before reading its body: %s", exc)
        # Closing the connection, so the server does not take in the unread body either.
        raise ApiError(403, "bad_signature", str(exc), headers={"Connection": "close"}) from None


async def sendgrid(request: Request):
    global _warned_unsigned
    settings = config.get()
    signed = _signed_headers(request, settings) if settings.sendgrid_webhook_public_key else None
    body = await read_body(request, settings.sendgrid_webhook_max_body_bytes)
    if signed is not None:
        try:
            signature.verify_body(settings.sendgrid_webhook_public_key, signed, body)
        except signature.SignatureError as exc:
            log.warning("sendgrid webhook refused: %s", exc)
            raise ApiError(403, "bad_signature", str(exc)) from None
    elif not _warned_unsigned:
        _warned_unsigned = True
        log.warning("SENDGRID_WEBHOOK_PUBLIC_KEY is not set: accepting unsigned webhook requests")
    try:
        rows = webhook_intake.rows_from_body(body)
    except webhook_intake.MalformedBatch as exc:
        log.warning("sendgrid webhook: malformed body (%d bytes): %s", len(body), exc)
        raise ApiError(400, "malformed_json", str(exc)) from None
    return await store(rows, "sendgrid")


async def store(rows: list[tuple], provider: str) -> FastJSONResponse:
    """Every provider's answer: 200 once the rows are committed by the group commit (new ones
    stored, redeliveries counted as duplicates), 503 when they could not be (nothing committed)."""
    if not rows:
        return FastJSONResponse({"stored": 0, "duplicates": 0})
    try:
        result = await asyncio.wrap_future(webhook_intake.writer().submit(rows, len(rows)))
    except Exception as exc:
        log.error("%s webhook batch of %d not stored: %s", provider, len(rows), exc)
        raise ApiError(
            503, "unavailable", "events not stored; nothing committed, retry later", headers={"Retry-After": "10"}
        ) from None
    return FastJSONResponse({"stored": result.stored, "duplicates": result.duplicates})


class WebhookStored(BaseModel):
    stored: int
    duplicates: int


routes = [
    api_route(
        "/webhooks/sendgrid",
        sendgrid,
        post=Operation(
            "SendGrid Event Webhook (signed); 200 only once the batch is committed",
            {200: ("committed", WebhookStored)},
            errors=(400, 403, 413, 503),
            example=Example(
                request=[
                    {
                        "email": "you@example.test",
                        "event": "delivered",
                        "sg_event_id": "ZGVsaXZlcmVkLTAtMTIzNDU2Nzg5",
                        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
                        "timestamp": 1764320400,
                    }
                ],
                answers={200: {"stored": 1, "duplicates": 0}},
            ),
        ),
    )
]
