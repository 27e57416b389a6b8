"""The provider interface shared by digests and newsletters.

A provider takes a batch of OutgoingMail and returns one SendResult per mail, in order. Errors
that concern the whole call raise: TransientError (retry later, same idempotency keys),
ThrottledError (a TransientError with a hint of when to retry), PermanentError (do not retry).
A per-mail failure is reported in its SendResult instead, so one bad address does not fail a batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class ProviderError(Exception):
    pass


class TransientError(ProviderError):
    """Try again later with the same idempotency key (network error, 5xx, timeout)."""


class ThrottledError(TransientError):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ProviderError):
    """The provider will never accept this (bad credentials, malformed request, rejected address)."""


@dataclass
class OutgoingMail:
    to: str
    subject: str
    html: str
    text: str
    idempotency_key: str                 # "digest-run-<id>" / "newsletter-<nl>-row-<id>"
    from_addr: str | None = None         # None: MAIL_FROM
    to_name: str = ""
    headers: dict = field(default_factory=dict)       # List-Unsubscribe, List-Unsubscribe-Post, …
    # Come back flattened in SendGrid webhook events: mail_kind, mail_id, row_id, subscriber_id.
    custom_args: dict = field(default_factory=dict)


@dataclass
class SendResult:
    ok: bool
    message_id: str | None = None
    error: str | None = None
    permanent: bool = False              # with ok=False: retrying will not help


class Provider:
    name = "base"
    max_batch = 1

    def send_batch(self, mails: list[OutgoingMail]) -> list[SendResult]:
        raise NotImplementedError

    def close(self) -> None:
        """Release pooled connections (called at worker shutdown)."""
