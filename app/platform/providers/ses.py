"""Amazon SES v2 `SendEmail` with `Content.Raw`: our own MIME (app/platform/mail.py), one request
per mail, LANES at a time (http_api.OnePerRequest), over httpx, signed with SigV4 by botocore.

What SES keeps of our mail: every header but two — SES replaces `Date` and `Message-ID` with its
own (docs.aws.amazon.com/ses/latest/dg/header-fields.html). So our DKIM signature (DKIM_DOMAIN…)
leaves those two out here, or SES would break it; SES's Easy DKIM signs the final message as well.
The mail's id is the `MessageId` SES answers: SES's webhooks (SNS notifications' `mail.messageId`)
report that one, so it is SendResult.message_id. Our custom_args go as EmailTags (they come back in
event notifications as `mail.tags`), sanitised to what SES allows.

Idempotency: SendEmail has no idempotency key. Exactly-once rests on the outbox row / digest run
(claimed once, recorded as sent in the transaction that follows the answer) and, for the one window
nothing can close — SES answered and the process died before recording it — a re-send carries the
same content and our key in the tags; SES gives it a new Message-ID. A timeout after the request
went out is ambiguous (http_api): retried on SES only, never through another provider.

Status mapping (SES answers errors with `x-amzn-ErrorType` and a JSON `message`):
200 ok; 400 MessageRejected / BadRequest (an address SES refuses) → that mail fails alone;
429 TooManyRequests and 400 LimitExceeded (sending quota) → ThrottledError; 5xx → TransientError
(504: ambiguous); 401/403 (credentials, signature), 404 (configuration set), AccountSuspended,
SendingPaused, MailFromDomainNotVerified → PermanentError for the call.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import botocore.session
import httpx
import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from app.platform import config, mail
from app.platform.providers import http_api
from app.platform.providers.base import (
    OutgoingMail,
    PermanentError,
    Progress,
    Provider,
    SendResult,
    ThrottledError,
)

PATH = "/v2/email/outbound-emails"
# SES replaces these two: a signature over them would not verify at the receiver.
DKIM_HEADERS = tuple(h for h in mail.DKIM_HEADERS if h not in (b"date", b"message-id"))
# SES's error types that mean "this recipient or message" rather than "this account".
_PER_MAIL = {"MessageRejected", "BadRequestException", "InvalidParameterValue"}
_THROTTLED = {"LimitExceededException", "TooManyRequestsException", "Throttling", "ThrottlingException"}
_TAG_VALUE = re.compile(r"[^A-Za-z0-9_-]")  # what SES allows in a tag value


class SESProvider(Provider):
    name = "ses"
    max_batch = 1000
    preferred_batch = 100  # one request per mail: a batch is only what a thread claims at once

    def __init__(
        self,
        region: str | None = None,
        endpoint_url: str | None = None,
        credentials: Credentials | None = None,
        timeout: float | None = None,
        lanes: int = http_api.LANES,
    ):
        settings = config.get()
        self.region = region or settings.ses_region
        base = endpoint_url or settings.ses_endpoint_url or f"https://email.{self.region}.amazonaws.com"
        self.url = base.rstrip("/") + PATH
        self.configuration_set = settings.ses_configuration_set
        self._credentials = credentials
        if credentials is None and settings.aws_access_key_id:
            self._credentials = Credentials(
                settings.aws_access_key_id, settings.aws_secret_access_key, settings.aws_session_token or None
            )
        self.http = http_api.client(timeout or settings.provider_timeout_seconds)
        self.lanes = http_api.OnePerRequest(self.name, lanes)

    def close(self) -> None:
        self.http.close()
        self.lanes.close()

    def _frozen(self) -> Any:
        if self._credentials is None:
            # botocore's chain: environment, profile, web identity, the ECS task or EC2 instance role
            # (refreshed by botocore when they expire).
            self._credentials = botocore.session.Session().get_credentials()
            if self._credentials is None:
                raise PermanentError("ses: no AWS credentials (AWS_ACCESS_KEY_ID or a role)")
        return self._credentials.get_frozen_credentials()

    def prepare(self, m: OutgoingMail) -> bytes:
        to = mail.check_address(m.to)
        if mail.needs_smtputf8(to):
            raise mail.MailBuildError(f"SES cannot send to {to!r}: a non-ASCII local part needs SMTPUTF8")
        body: dict[str, Any] = {
            "FromEmailAddress": mail.sender(m.from_addr),
            "Destination": {"ToAddresses": [to]},
            "Content": {"Raw": {"Data": base64.b64encode(mail.build(m, dkim_headers=DKIM_HEADERS)).decode()}},
            "EmailTags": [
                {"Name": k, "Value": _TAG_VALUE.sub("_", str(v))[:256] or "_"}
                for k, v in {**m.custom_args, "idempotency_key": m.idempotency_key}.items()
            ],
        }
        if self.configuration_set:
            body["ConfigurationSetName"] = self.configuration_set
        return orjson.dumps(body)

    def deliver(self, prepared: list[tuple[OutgoingMail, bytes]], progress: Progress) -> list[SendResult]:
        return self.lanes.deliver(prepared, progress, self._send_one)

    def _send_one(self, m: OutgoingMail, body: bytes) -> SendResult:
        signed = AWSRequest(method="POST", url=self.url, data=body, headers={"Content-Type": "application/json"})
        SigV4Auth(self._frozen(), "ses", self.region).add_auth(signed)
        response = http_api.request(self.http, "SES", "POST", self.url, content=body, headers=dict(signed.headers))
        kind, detail = _error(response)
        if response.status_code == 400 and kind in _THROTTLED:
            raise ThrottledError(f"SES 400 {kind}: {detail}", retry_after=1.0)  # quota: back off
        per_mail = (400,) if kind in _PER_MAIL else ()
        http_api.raise_for_status("SES", response, f"{kind}: {detail}" if kind else detail, per_mail=per_mail)
        message_id = orjson.loads(response.content).get("MessageId")
        return SendResult(ok=True, message_id=message_id)


def _error(response: httpx.Response) -> tuple[str, str]:
    """(error type, message) of an SES error answer; ("", "") for a success."""
    if response.status_code < 300:
        return "", ""
    kind = response.headers.get("x-amzn-ErrorType", "").split(":")[0]
    try:
        data = orjson.loads(response.content)
        message = str(data.get("message") or data.get("Message") or "")
        kind = kind or str(data.get("__type", "")).rpartition("#")[2]
    except Exception:
        message = response.text
    return kind, (message or response.reason_phrase or "")[:400]
