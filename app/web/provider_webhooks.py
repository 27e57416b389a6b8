"""POST /webhooks/ses, /webhooks/postmark, /webhooks/mailgun: each provider's events, authenticated
before their body is trusted and before any row is written, then stored like SendGrid's
(app/web/webhooks.py `store`: 2xx only once committed, each provider event id once).

  /webhooks/ses       Amazon SNS messages (tracking/sns.py verifies them; tracking/ses_events.py
                      reads the SES event inside). 403: not signed by SNS, stale, or from a topic
                      not in SES_SNS_TOPIC_ARNS. A SubscriptionConfirmation of an allowed topic is
                      confirmed (its SubscribeURL fetched); 502 if SNS did not take it (SNS resends).
  /webhooks/postmark  HTTP basic auth (tracking/postmark_events.py), checked before the body is
                      read: 401 and a closed connection without it (Postmark retries a 401, so
                      fixing the credentials loses nothing; a 403 would stop its retries).
  /webhooks/mailgun   the signature in the body (tracking/mailgun_events.py): 403 when wrong, stale
                      or a token used before; 503 when Redis cannot say whether it was.

A route whose secret is not set answers 404 (in every environment: none of them ever takes an
unauthenticated event). Outside development/test the web process refuses to start when a provider
the mail providers name (MAIL_PROVIDER, or MAIL_PROVIDERS when set) has no webhook secret: its
bounces and complaints would otherwise never reach the suppression list.
"""

from __future__ import annotations

import json
import logging

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app.platform import config, http
from app.platform.http import ApiError, read_body
from app.platform.openapi import Example, Operation, api_route
from app.web.webhooks import WebhookStored, store
from tracking import mailgun_events, postmark_events, ses_events, sns

log = logging.getLogger("app.web.provider_webhooks")

# An SNS message is at most 256 KiB, plus its envelope; Postmark and Mailgun post one event each.
SNS_MAX_BODY_BYTES = 512 * 1024
EVENT_MAX_BODY_BYTES = 1024 * 1024

# What each provider's route needs, by the name MAIL_PROVIDER(S) gives the provider.
REQUIRED = {
    "ses": (("ses_sns_topic_arns",), "SES_SNS_TOPIC_ARNS (the SNS topic ARNs your SES events are published to)"),
    "postmark": (
        ("postmark_webhook_user", "postmark_webhook_password"),
        "POSTMARK_WEBHOOK_USER and POSTMARK_WEBHOOK_PASSWORD (the basic auth credentials of Postmark's webhook URL)",
    ),
    "mailgun": (("mailgun_webhook_signing_key",), "MAILGUN_WEBHOOK_SIGNING_KEY (Mailgun's HTTP webhook signing key)"),
}


def providers_in_use(settings: config.Settings) -> set[str]:
    """The providers mail goes out through: MAIL_PROVIDERS (the failover list) when it is set, else
    MAIL_PROVIDER."""
    listed = settings.mail_providers or settings.mail_provider
    names = listed.split(",") if isinstance(listed, str) else listed
    return {str(name).strip().lower() for name in names if str(name).strip()}


def check_config(settings: config.Settings) -> None:
    """Web start-up: half a Postmark credential or an unreadable SNS certificate file is an error
    now rather than a refusal per request; in production, a provider in use needs its webhook secret."""
    if bool(settings.postmark_webhook_user) != bool(settings.postmark_webhook_password):
        raise config.ConfigError("POSTMARK_WEBHOOK_USER and POSTMARK_WEBHOOK_PASSWORD are set together or not at all")
    if settings.sns_signing_cert_file:
        try:
            sns.certificates(settings.sns_signing_cert_file)
        except sns.SnsError as exc:
            raise config.ConfigError(str(exc)) from None
    for arn in settings.ses_sns_topic_arns:
        if not arn.startswith("arn:aws") or arn.count(":") != 5:
            raise config.ConfigError(
                f"SES_SNS_TOPIC_ARNS: {arn!r} is not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)"
            )
    if settings.is_development:
        return
    for provider in sorted(providers_in_use(settings) & set(REQUIRED)):
        names, what = REQUIRED[provider]
        if not all(getattr(settings, name) for name in names):
            raise config.ConfigError(
                f"the mail providers include {provider} (APP_ENV={settings.env}) but /webhooks/{provider} has "
                f"no secret: its bounces and complaints would never suppress an address. Set {what}; "
                "docs/tracking.md says how to point the webhooks here."
            )


def _not_configured(provider: str) -> ApiError:
    return ApiError(404, "not_configured", f"this service takes no {provider} webhooks (not configured)")


def _json(body: bytes, provider: str):
    try:
        return http.parse_json(body)
    except http.JSONBodyError as exc:
        log.warning("%s webhook: malformed body (%d bytes): %s", provider, len(body), exc)
        raise ApiError(400, "malformed_json", str(exc)) from None


async def ses(request: Request):
    settings = config.get()
    if not settings.ses_sns_topic_arns:
        raise _not_configured("Amazon SES")
    data = _json(await read_body(request, SNS_MAX_BODY_BYTES), "ses")
    declared = request.headers.get("x-amz-sns-message-type")
    try:
        if declared is not None and isinstance(data, dict) and declared != data.get("Type"):
            raise sns.SnsError("x-amz-sns-message-type does not match the message's Type")
        certificates = sns.certificates(settings.sns_signing_cert_file)
        args = (data, settings.ses_sns_topic_arns, certificates, settings.sns_max_age_seconds)
        if certificates.at_hand(data.get("SigningCertURL") if isinstance(data, dict) else None):
            message = sns.verify(*args)  # an RSA verification: cheaper than a thread hop
        else:  # off the event loop: the first message naming a certificate URL fetches it
            message = await run_in_threadpool(sns.verify, *args)
    except sns.SnsError as exc:
        log.warning("ses webhook refused: %s", exc)
        raise ApiError(403, "bad_signature", str(exc)) from None
    if message.type == "SubscriptionConfirmation":
        try:
            await run_in_threadpool(sns.confirm_subscription, message)
        except sns.SnsError as exc:
            log.error("SNS subscription to %s not confirmed: %s", message.topic_arn, exc)
            raise ApiError(502, "not_confirmed", f"subscription not confirmed: {exc}") from None
        log.info("SNS subscription to %s confirmed", message.topic_arn)
        return await store([], "ses")
    if message.type == "UnsubscribeConfirmation":
        # Someone unsubscribed this endpoint from the topic: said loudly, not undone here.
        log.warning("SNS: this endpoint was unsubscribed from %s (SES events stop arriving)", message.topic_arn)
        return await store([], "ses")
    return await store(ses_events.rows_from_message(message.message_id, message.message), "ses")


async def postmark(request: Request):
    settings = config.get()
    if not (settings.postmark_webhook_user and settings.postmark_webhook_password):
        raise _not_configured("Postmark")
    if not postmark_events.authorized(
        request.headers.get("authorization"), settings.postmark_webhook_user, settings.postmark_webhook_password
    ):
        log.warning("postmark webhook refused before reading its body: wrong or missing credentials")
        raise ApiError(
            401,
            "unauthorized",
            "wrong or missing basic auth credentials",
            headers={"WWW-Authenticate": 'Basic realm="webhooks"', "Connection": "close"},
        )
    data = _json(await read_body(request, EVENT_MAX_BODY_BYTES), "postmark")
    try:
        rows = postmark_events.rows_from_record(data)
    except postmark_events.Unusable as exc:
        raise ApiError(400, "malformed_json", str(exc)) from None
    return await store(rows, "postmark")


async def mailgun(request: Request):
    settings = config.get()
    key, max_age = settings.mailgun_webhook_signing_key, settings.mailgun_webhook_max_age_seconds
    if not key:
        raise _not_configured("Mailgun")
    data = _json(await read_body(request, EVENT_MAX_BODY_BYTES), "mailgun")
    try:
        token = mailgun_events.verify(data, key, max_age)
        rows = mailgun_events.rows_from_body(data)
        await run_in_threadpool(mailgun_events.claim_token, token, max_age)
    except mailgun_events.Unusable as exc:
        raise ApiError(400, "malformed_json", str(exc)) from None
    except mailgun_events.MailgunError as exc:
        log.warning("mailgun webhook refused: %s", exc)
        raise ApiError(403, "bad_signature", str(exc)) from None
    except mailgun_events.TokensUnavailable as exc:
        log.error("mailgun webhook: used tokens cannot be checked (Redis: %s); refused, Mailgun retries", exc)
        raise ApiError(
            503, "unavailable", "cannot check the token now; retry later", headers={"Retry-After": "10"}
        ) from None
    try:
        return await store(rows, "mailgun")
    except ApiError:
        await run_in_threadpool(mailgun_events.release, token)
        raise


# The reference's examples. What each provider posts: signed or with credentials that only a real
# delivery (or a test that signs with its own key: tests/tracking/test_webhook_*.py) can have.
SES_BOUNCE = {
    "eventType": "Bounce",
    "bounce": {
        "bounceType": "Permanent",
        "bounceSubType": "General",
        "bouncedRecipients": [{"emailAddress": "you@example.test", "action": "failed", "status": "5.1.1"}],
        "timestamp": "2025-11-28T09:00:01.000Z",
        "feedbackId": "0100019a-0000-4000-8000-000000000001-000000",
    },
    "mail": {
        "timestamp": "2025-11-28T09:00:00.000Z",
        "source": "Notify <notify@example.test>",
        "messageId": "0100019a-0000-4000-8000-000000000000-000000",
        "destination": ["you@example.test"],
    },
}
SES_EXAMPLE = {
    "Type": "Notification",
    "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
    "TopicArn": "arn:aws:sns:eu-west-1:123456789012:ses-events",
    "Message": json.dumps(SES_BOUNCE),
    "Timestamp": "2025-11-28T09:00:02.000Z",
    "SignatureVersion": "2",
    "Signature": "EXAMPLEpH+DcEwjAPg8O9mY8dReBSwksfg2S7WKQcikcNKWLQjwu6A4VbeS0QHVCkhRS7fUQvi2egU3N858fiTDN6bk"
    "kOxYDVrY0Ad8L10Hs3zH81mtnPk5uvvolIC1CXGu43obcgFxeL3khZl8IKvO61GWB6jI9b5+gLPoBc1Q=",
    "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem",
    "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn="
    "arn:aws:sns:eu-west-1:123456789012:ses-events:5b6bd0a2-0000-4000-8000-000000000000",
}
POSTMARK_EXAMPLE = {
    "RecordType": "Bounce",
    "MessageStream": "outbound",
    "ID": 4323372036854775807,
    "Type": "HardBounce",
    "TypeCode": 1,
    "Name": "Hard bounce",
    "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
    "Description": "The server was unable to deliver your message (ex: unknown user, mailbox not found).",
    "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
    "Email": "you@example.test",
    "From": "notify@example.test",
    "BouncedAt": "2025-11-28T09:00:01Z",
    "Inactive": True,
    "CanActivate": True,
}
MAILGUN_EXAMPLE = {
    "signature": {
        "timestamp": "1764320401",
        "token": "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0",
        "signature": "d2271d12299f6592d9d44cd9d250f0704e4674c30d79d07c47a66f95ce71cf55",
    },
    "event-data": {
        "id": "CPgfbmQMTCKtHW6uIWtuVe",
        "event": "failed",
        "severity": "permanent",
        "reason": "bounce",
        "timestamp": 1764320401.0,
        "recipient": "you@example.test",
        "message": {"headers": {"message-id": "20251128090000.1.ABCDEF@mg.example.test"}},
        "delivery-status": {"code": 550, "attempt-no": 1, "message": "5.1.1 The email account does not exist"},
    },
}

routes = [
    api_route(
        "/webhooks/ses",
        ses,
        post=Operation(
            "Amazon SES events over Amazon SNS (signed by SNS; topics in SES_SNS_TOPIC_ARNS); 200 only once committed",
            {200: ("committed (or the subscription confirmed)", WebhookStored)},
            errors=(400, 403, 404, 413, 502, 503),
            description="Point an SNS topic your SES events go to at this URL (docs/tracking.md). Each message "
            "is verified before anything in it is used: its SNS signature (v1 or v2) by a certificate from an "
            "SNS host, its age and its topic (SES_SNS_TOPIC_ARNS). 404 while no topic is configured.",
            example=Example(request=SES_EXAMPLE, answers={200: {"stored": 1, "duplicates": 0}}),
        ),
    ),
    api_route(
        "/webhooks/postmark",
        postmark,
        post=Operation(
            "Postmark webhooks (HTTP basic auth); 200 only once committed",
            {200: ("committed", WebhookStored)},
            errors=(400, 401, 404, 413, 503),
            description="Postmark's webhook URL with basic auth credentials (POSTMARK_WEBHOOK_USER, "
            "POSTMARK_WEBHOOK_PASSWORD), checked before the body is read. 404 while none are configured.",
            example=Example(request=POSTMARK_EXAMPLE, answers={200: {"stored": 1, "duplicates": 0}}),
        ),
    ),
    api_route(
        "/webhooks/mailgun",
        mailgun,
        post=Operation(
            "Mailgun webhooks (HMAC-SHA256 signature, each token once); 200 only once committed",
            {200: ("committed", WebhookStored)},
            errors=(400, 403, 404, 413, 503),
            description="Mailgun's webhooks, signed with MAILGUN_WEBHOOK_SIGNING_KEY: the signature, its age "
            "(MAILGUN_WEBHOOK_MAX_AGE_SECONDS) and its token (accepted once) are checked before the event is "
            "used. 404 while no key is configured.",
            example=Example(request=MAILGUN_EXAMPLE, answers={200: {"stored": 1, "duplicates": 0}}),
        ),
    ),
]
