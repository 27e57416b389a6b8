"""Mailgun `POST /v3/{domain}/messages.mime`: our own MIME (app/platform/mail.py: DKIM,
List-Unsubscribe, Message-ID kept), one request per mail, LANES at a time (http_api.OnePerRequest),
basic auth `api:{MAILGUN_API_KEY}`; MAILGUN_API_URL picks the US or EU region.

Mailgun keeps the Message-ID of a MIME upload and answers it as `id` (`<…>`); its webhooks report it
without the brackets (`event-data.message.headers.message-id`), so that is SendResult.message_id.
Our custom_args and the idempotency key go as `v:` variables (webhooks' `user-variables`); Mailgun's
own click and open tracking is off (`o:tracking=no`): ours rewrote the links already.

Idempotency: Mailgun has no idempotency key. Exactly-once rests on the outbox row / digest run
(claimed once, recorded as sent after the answer) and the stable Message-ID; a crash between
Mailgun's answer and our record re-sends at most one batch, with the same Message-ID. A timeout
after the request went out is ambiguous (http_api): retried on Mailgun only.

Status mapping: 200 ok; 400 (a message or recipient Mailgun refuses) and 413 → that mail fails
alone; 429 → ThrottledError; 5xx → TransientError (504: ambiguous); 401 (key), 402/403 (account),
404 (unknown domain) → PermanentError for the call.
"""

from __future__ import annotations

import dataclasses

import httpx
import orjson

from app.platform import config, mail
from app.platform.providers import http_api
from app.platform.providers.base import OutgoingMail, Progress, Provider, SendResult


class MailgunProvider(Provider):
    name = "mailgun"
    max_batch = 1000
    preferred_batch = 100  # one request per mail: a batch is only what a thread claims at once

    def __init__(
        self,
        api_key: str | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        timeout: float | None = None,
        lanes: int = http_api.LANES,
    ):
        settings = config.get()
        self.auth = ("api", api_key if api_key is not None else settings.mailgun_api_key)
        self.domain = domain or settings.mailgun_domain
        self.url = f"{(api_url or settings.mailgun_api_url).rstrip('/')}/v3/{self.domain}/messages.mime"
        self.http = http_api.client(timeout or settings.provider_timeout_seconds)
        self.lanes = http_api.OnePerRequest(self.name, lanes)

    def close(self) -> None:
        self.http.close()
        self.lanes.close()

    def prepare(self, m: OutgoingMail) -> tuple[dict[str, str], bytes]:
        m = dataclasses.replace(m, to=mail.check_address(m.to))  # the envelope's form (IDNA domain)
        fields = {"to": m.to, "o:tracking": "no", "o:tracking-clicks": "no", "o:tracking-opens": "no"}
        for k, v in {**m.custom_args, "idempotency_key": m.idempotency_key}.items():
            fields[f"v:{k}"] = str(v)
        return fields, mail.build(m)

    def deliver(
        self, prepared: list[tuple[OutgoingMail, tuple[dict[str, str], bytes]]], progress: Progress
    ) -> list[SendResult]:
        return self.lanes.deliver(prepared, progress, self._send_one)

    def _send_one(self, m: OutgoingMail, item: tuple[dict[str, str], bytes]) -> SendResult:
        fields, raw = item
        response = http_api.request(
            self.http,
            "Mailgun",
            "POST",
            self.url,
            data=fields,
            files={"message": ("message.mime", raw, "application/octet-stream")},
            auth=self.auth,
        )
        http_api.raise_for_status("Mailgun", response, _detail(response), per_mail=(400, 413))
        answer = orjson.loads(response.content)
        return SendResult(ok=True, message_id=str(answer.get("id") or "").strip("<>") or mail.message_id_of(m))


def _detail(response: httpx.Response) -> str:
    try:
        return str(orjson.loads(response.content).get("message", ""))[:400]
    except Exception:
        return (response.text or response.reason_phrase or "")[:400]
