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

Stopping between two mails (`Progress`): a caller that must be able to stop a batch midway (pause,
cancel, the emergency stop) and record what was accepted as it goes passes a Progress. The
provider reports each result as it arrives and starts no mail once a stop was requested; the mails
it did not start come back as `SendResult(stopped=True)`, never attempted. While the provider
works, the calling thread runs `Progress.poll()` (the provider calls it for the caller), which every
`every` results or `interval` seconds hands the new results to the caller's `flush` callback. A
flush that raises (the outcomes cannot be recorded: Postgres is away) stops the batch as a stop
request does: a sender never goes on starting mail it could not record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.platform import metrics

log = logging.getLogger("app.platform.providers")


class ProviderError(Exception):
    pass


class TransientError(ProviderError):
    """Try again later with the same idempotency key (network error, 5xx, timeout)."""


class ThrottledError(TransientError):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class AmbiguousError(TransientError):
    """The request went out and no answer came back (a read timeout, a dropped connection, a
    gateway's 504): the provider may have accepted the mail. Retried on the same provider only —
    sending it through another could deliver it twice."""


class PermanentError(ProviderError):
    """The provider will never accept this (bad credentials, malformed request, rejected address)."""


@dataclass
class OutgoingMail:
    to: str
    subject: str
    html: str
    text: str
    idempotency_key: str  # "digest-run-<id>" / "newsletter-<nl>-row-<id>"
    from_addr: str | None = None  # None: MAIL_FROM
    to_name: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # List-Unsubscribe, List-Unsubscribe-Post, …
    # Come back flattened in SendGrid webhook events: mail_kind, mail_id, row_id, subscriber_id.
    custom_args: dict[str, str] = field(default_factory=dict)
    # An earlier attempt's outcome at this provider is unknown (ambiguous): only it may send this
    # mail again (failover.py); None: any provider
    provider: str | None = None
    # The template it was rendered from ("newsletter-7-pt-BR": a newsletter's variant): a provider that
    # factors a batch into shared bodies (sendgrid.py) shares one only between mails of one template.
    template: str = ""


@dataclass
class SendResult:
    ok: bool
    message_id: str | None = None
    error: str | None = None
    permanent: bool = False  # with ok=False: retrying will not help
    stopped: bool = False  # with ok=False: never attempted, the caller asked to stop
    # with ok=False: the request went out and no answer came (AmbiguousError): it may have been
    # accepted, so only the same provider may try it again
    ambiguous: bool = False
    # who accepted it (ok), or may have (ambiguous); send_batch fills it in with the provider's name
    provider: str | None = None


STOPPED = SendResult(ok=False, error="not attempted: sending was stopped", stopped=True)


class Progress:
    """Shared by the thread that sends a batch and the provider's sending threads (see the module
    docstring). `flush(new_results)` runs on the calling thread only, gets [(index, SendResult)]
    in the batch's order of arrival and returns True to stop the rest of the batch."""

    def __init__(self, flush: Callable[[list[tuple[int, SendResult]]], bool], every: int = 100, interval: float = 0.25):
        self._flush, self.every, self.interval = flush, max(1, every), interval
        self._owner = threading.get_ident()
        self._ready = threading.Condition()
        self._new: list[tuple[int, SendResult]] = []
        self._stop = threading.Event()
        self._last = time.monotonic()

    def add(self, index: int, result: SendResult) -> None:
        """A result, from any thread."""
        with self._ready:
            self._new.append((index, result))
            if len(self._new) >= self.every:
                self._ready.notify()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait(self, until: float) -> None:
        """Block the calling thread until a flush is due, or `until` (time.monotonic())."""
        with self._ready:
            if len(self._new) < self.every:
                self._ready.wait(max(0.0, min(until, self._last + self.interval) - time.monotonic()))

    def wake(self) -> None:
        with self._ready:
            self._ready.notify()

    def poll(self, final: bool = False) -> None:
        """On the calling thread (a no-op elsewhere): flush when due, or always when `final`."""
        if threading.get_ident() != self._owner:
            return
        now = time.monotonic()
        if not final and len(self._new) < self.every and now - self._last < self.interval:
            return
        new = self.drain()
        self._last = now
        try:
            stop = self._flush(new)
        except Exception as exc:
            # What cannot be recorded must not grow: no mail is started until the caller has written
            # what it holds (it keeps the results and its claim; app/platform/holds.py).
            log.warning("recording a batch's progress failed (%s); no further mail of the batch is started", exc)
            stop = True
        if stop:
            self._stop.set()

    def drain(self) -> list[tuple[int, SendResult]]:
        """The results reported since the last flush, taken."""
        with self._ready:
            new, self._new = self._new, []
        return new


def _result(exc: ProviderError) -> str:
    """A failed provider call's `result` label in notify_provider_calls_total."""
    return (
        "ambiguous"
        if isinstance(exc, AmbiguousError)
        else "throttled"
        if isinstance(exc, ThrottledError)
        else "transient"
        if isinstance(exc, TransientError)
        else "permanent"
    )


class Provider:
    name = "base"
    max_batch = 1
    preferred_batch = 1  # rows a newsletter claims per call when SEND_BATCH_SIZE is 0 (the default)

    def prepare(self, mail: OutgoingMail) -> Any:
        """What deliver() needs for one mail. Raise anything to refuse this mail alone."""
        return mail

    def deliver(self, prepared: list[tuple[OutgoingMail, Any]], progress: Progress) -> list[SendResult]:
        """[(mail, prepare(mail))] → one SendResult each, in order. Before starting a mail (or a
        group of mails sent in one call), check `progress.stop_requested()` and answer STOPPED for
        the mails not started; `progress.add(i, result)` each result as it arrives, and let the
        calling thread `progress.poll()` while it waits."""
        raise NotImplementedError

    def send_batch(self, mails: list[OutgoingMail], progress: Progress | None = None) -> list[SendResult]:
        if len(mails) > self.max_batch:  # a caller's bug, not the mails' fault
            raise ValueError(f"at most {self.max_batch} mails per batch, got {len(mails)}")
        results: list[SendResult | None] = [None] * len(mails)
        ready, positions = [], []
        outer = progress
        for i, m in enumerate(mails):
            try:
                ready.append((m, self.prepare(m)))
                positions.append(i)
            except Exception as exc:
                log.warning("%s: mail %s cannot be built: %s", self.name, m.idempotency_key, exc)
                results[i] = failed = SendResult(ok=False, error=f"cannot build mail: {exc}"[:1000], permanent=True)
                if outer is not None:
                    outer.add(i, failed)
        if ready:
            # deliver() counts in `ready`; the caller's progress in `mails`.
            inner = _Renumbered(outer, positions, self.name) if outer is not None else Progress(lambda new: False)
            metrics.PROVIDER_IN_FLIGHT.labels(self.name).inc()
            started = time.perf_counter()
            try:
                delivered = self.deliver(ready, inner)
            except AmbiguousError as exc:
                # Raised only when nothing of the call was reported: each mail carries the outcome,
                # so the caller records which provider alone may try it again.
                metrics.provider_call(self.name, _result(exc), started)
                delivered = [SendResult(ok=False, error=str(exc)[:1000], ambiguous=True) for _ in ready]
                for i, result in enumerate(delivered):
                    inner.add(i, result)
            except ProviderError as exc:
                metrics.provider_call(self.name, _result(exc), started)
                raise
            except Exception as exc:
                metrics.provider_call(self.name, "unexpected", started)
                log.exception("%s: unexpected error delivering %d mail(s)", self.name, len(ready))
                raise TransientError(f"unexpected {self.name} error: {exc!r}"[:1000]) from exc
            else:
                metrics.provider_call(self.name, "ok", started)
            if len(delivered) != len(ready):  # never leave a row claimed because a provider miscounted
                raise TransientError(f"{self.name} returned {len(delivered)} results for {len(ready)} mails")
            ambiguous = 0
            for i, result in zip(positions, delivered):
                if (result.ok or result.ambiguous) and result.provider is None:
                    result.provider = self.name  # results are fresh objects (STOPPED is neither)
                ambiguous += result.ambiguous and result.provider == self.name  # a wrapper's members count their own
                results[i] = result
            if ambiguous:
                metrics.PROVIDER_AMBIGUOUS.labels(self.name).inc(ambiguous)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Release pooled connections (called at worker shutdown)."""


class _Renumbered(Progress):
    """The caller's Progress seen through deliver()'s numbering (mails that could not be built are
    not handed to deliver)."""

    def __init__(self, outer: Progress, positions: list[int], provider: str | None):
        self._outer, self._positions, self._provider = outer, positions, provider

    def add(self, index: int, result: SendResult) -> None:
        if (result.ok or result.ambiguous) and result.provider is None:
            result.provider = self._provider  # recorded as it arrives: who accepted it
        self._outer.add(self._positions[index], result)

    def stop_requested(self) -> bool:
        return self._outer.stop_requested()

    def wait(self, until: float) -> None:
        self._outer.wait(until)

    def wake(self) -> None:
        self._outer.wake()

    def poll(self, final: bool = False) -> None:
        self._outer.poll(final)
