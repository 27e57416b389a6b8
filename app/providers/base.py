"""The provider interface shared by digests and newsletters.

A provider takes a batch of OutgoingMail and returns one SendResult per mail, in order.

Failure isolation is part of the interface, not left to each provider:
  - `prepare(mail)` turns one mail into what the provider sends (wire bytes, a JSON
    personalization). It runs once per mail, on its own: ANY exception there (a header with a line
    break, an address that cannot be encoded, a bug) fails that mail alone, permanently, with the
    error kept — the rest of the batch goes out.
  - `deliver(prepared)` hands the prepared mails over. A problem of one recipient (a refused
    address, a 5xx reply to that message) comes back in its SendResult. Problems of the whole call
    raise: TransientError (retry later, same idempotency keys), ThrottledError (a TransientError
    with a hint of when to retry), PermanentError (every mail would fail the same way).
  - Anything else `deliver` raises is unexpected: send_batch reports it as a TransientError for the
    whole call, so callers only ever see the three documented errors. They retry it with backoff
    and count the attempt, so an unexpected error cannot loop forever.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from app import metrics

log = logging.getLogger("app.providers")


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


def _result(exc: ProviderError) -> str:
    """A failed provider call's `result` label in notify_provider_calls_total."""
    return "throttled" if isinstance(exc, ThrottledError) else "transient" if isinstance(exc, TransientError) \
        else "permanent"


class Provider:
    name = "base"
    max_batch = 1
    preferred_batch = 1   # rows a newsletter claims per call when SEND_BATCH_SIZE is 0 (the default)

    def prepare(self, mail: OutgoingMail):
        """What deliver() needs for one mail. Raise anything to refuse this mail alone."""
        return mail

    def deliver(self, prepared: list[tuple[OutgoingMail, object]]) -> list[SendResult]:
        """[(mail, prepare(mail))] → one SendResult each, in order."""
        raise NotImplementedError

    def send_batch(self, mails: list[OutgoingMail]) -> list[SendResult]:
        if len(mails) > self.max_batch:   # a caller's bug, not the mails' fault
            raise ValueError(f"at most {self.max_batch} mails per batch, got {len(mails)}")
        results: list[SendResult | None] = [None] * len(mails)
        ready, positions = [], []
        for i, m in enumerate(mails):
            try:
                ready.append((m, self.prepare(m)))
                positions.append(i)
            except Exception as exc:  # noqa: BLE001 - any per-mail problem fails that mail only
                log.warning("%s: mail %s cannot be built: %s", self.name, m.idempotency_key, exc)
                results[i] = SendResult(ok=False, error=f"cannot build mail: {exc}"[:1000], permanent=True)
        if ready:
            metrics.PROVIDER_IN_FLIGHT.labels(self.name).inc()
            started = time.perf_counter()
            try:
                delivered = self.deliver(ready)
            except ProviderError as exc:
                metrics.provider_call(self.name, _result(exc), started)
                raise
            except Exception as exc:  # noqa: BLE001 - a bug or library surprise: the caller retries the batch
                metrics.provider_call(self.name, "unexpected", started)
                log.exception("%s: unexpected error delivering %d mail(s)", self.name, len(ready))
                raise TransientError(f"unexpected {self.name} error: {exc!r}"[:1000]) from exc
            metrics.provider_call(self.name, "ok", started)
            if len(delivered) != len(ready):   # never leave a row claimed because a provider miscounted
                raise TransientError(f"{self.name} returned {len(delivered)} results for {len(ready)} mails")
            for i, result in zip(positions, delivered):
                results[i] = result
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Release pooled connections (called at worker shutdown)."""
