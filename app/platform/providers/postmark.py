"""Postmark `POST /email/batch`: up to 500 mails per call, each answered on its own.

Postmark takes no raw MIME, so our mail goes as its parts: From, To, Subject, HtmlBody, TextBody,
our headers (List-Unsubscribe, List-Unsubscribe-Post, and the Message-ID mail.py would give it) in
`Headers`, and our custom_args plus the idempotency key as `Metadata` (it comes back in every
webhook). Postmark signs with its own DKIM for the sender's domain; DKIM_* here is not used. Its open
and link tracking are turned off: ours rewrote the links already. Digests go to
POSTMARK_DIGEST_STREAM, newsletters (and test sends) to POSTMARK_NEWSLETTER_STREAM.
SendResult.message_id is Postmark's `MessageID`, the id its webhooks report.

Idempotency: Postmark has no idempotency key. Exactly-once rests on the outbox row / digest run
(claimed once, recorded as sent once the answer came) and a stable Message-ID; the window where a
crash after Postmark's answer re-sends is one batch. A timeout after the batch went out is
ambiguous (http_api): every mail of it is retried on Postmark only, never through another provider.

Status mapping: 200 → each message's own `ErrorCode` (0 accepted; anything else, such as 406
"inactive recipient" or 300 "invalid email request", fails that mail alone, permanently);
429 → ThrottledError; 5xx → TransientError (504: ambiguous); 401 (token), 422 (the request itself:
its `ErrorCode` and `Message` kept) and other 4xx → PermanentError for the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from app.platform import config, mail
from app.platform.providers import http_api
from app.platform.providers.base import STOPPED, AmbiguousError, OutgoingMail, Progress, Provider, SendResult

MAX_BATCH = 500
INACTIVE_RECIPIENT = 406


class PostmarkProvider(Provider):
    name = "postmark"
    max_batch = MAX_BATCH
    preferred_batch = MAX_BATCH

    def __init__(self, server_token: str | None = None, api_url: str | None = None, timeout: float | None = None):
        settings = config.get()
        self.token = server_token if server_token is not None else settings.postmark_server_token
        self.url = (api_url or settings.postmark_api_url).rstrip("/") + "/email/batch"
        self.streams = {"digest": settings.postmark_digest_stream}
        self.newsletter_stream = settings.postmark_newsletter_stream
        self.http = http_api.client(timeout or settings.provider_timeout_seconds)

    def close(self) -> None:
        self.http.close()

    def prepare(self, m: OutgoingMail) -> dict[str, Any]:
        """What Postmark would refuse for this recipient, refused here alone (as SendGrid's)."""
        mail.validate(m)
        to = mail.check_address(m.to)
        if mail.needs_smtputf8(to):
            raise mail.MailBuildError(f"Postmark cannot send to {to!r}: a non-ASCII local part needs SMTPUTF8")
        m = dataclasses.replace(m, to=to)
        headers = {**m.headers, "Message-ID": f"<{mail.message_id_of(m)}>"}
        message: dict[str, Any] = {
            "From": mail.sender(m.from_addr),
            "To": mail._address(mail.one_line(m.to_name), to),
            "Subject": m.subject,
            "HtmlBody": m.html,
            "Headers": [{"Name": k, "Value": str(v)} for k, v in headers.items()],
            "Metadata": {**{k: str(v) for k, v in m.custom_args.items()}, "idempotency_key": m.idempotency_key},
            "MessageStream": self.streams.get(m.custom_args.get("mail_kind", ""), self.newsletter_stream),
            "TrackOpens": False,
            "TrackLinks": "None",
        }
        if m.text:
            message["TextBody"] = m.text
        return message

    def deliver(self, prepared: list[tuple[OutgoingMail, dict[str, Any]]], progress: Progress) -> list[SendResult]:
        progress.poll()
        if progress.stop_requested():
            for i in range(len(prepared)):
                progress.add(i, STOPPED)
            return [STOPPED] * len(prepared)
        headers = {
            "X-Postmark-Server-Token": self.token,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        body = orjson.dumps([message for _, message in prepared])
        response = http_api.request(self.http, "Postmark", "POST", self.url, content=body, headers=headers)
        http_api.raise_for_status("Postmark", response, _detail(response))
        answers = orjson.loads(response.content)
        if not isinstance(answers, list) or len(answers) != len(prepared):
            # Accepted, but we cannot tell which: retried (Message-IDs stay the same), and said loudly.
            raise AmbiguousError(f"Postmark answered {len(answers)} results for {len(prepared)} mails")
        results = [_result(answer) for answer in answers]
        for i, result in enumerate(results):
            progress.add(i, result)
        return results


def _result(answer: dict[str, Any]) -> SendResult:
    code = answer.get("ErrorCode", -1)
    if code == 0:
        return SendResult(ok=True, message_id=answer.get("MessageID"))
    what = "inactive recipient (bounced, complained or unsubscribed at Postmark)" if code == INACTIVE_RECIPIENT else ""
    error = f"postmark ErrorCode {code}: {answer.get('Message', '')} {what}".strip()
    return SendResult(ok=False, error=error[:1000], permanent=True)


def _detail(response: Any) -> str:
    try:
        data = orjson.loads(response.content)
        return f"ErrorCode {data.get('ErrorCode')}: {data.get('Message')}"
    except Exception:
        return (response.text or response.reason_phrase or "")[:400]
