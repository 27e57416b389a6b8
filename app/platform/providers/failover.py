"""Failover (MAIL_PROVIDERS=postmark,ses): one Provider over an ordered list of providers, with a
circuit breaker per provider.

Where a batch goes: to the first provider whose breaker lets it through. When that provider fails
the whole call DEFINITELY — it cannot have accepted these mails: a refused connection, a 5xx, a 429,
a call refused as a whole — the failure counts against its breaker and the mails go on to the next
provider at once, in the same call. Mails it answered for stay answered (a refused recipient fails
alone, wherever it would go).

What never moves: an ambiguous outcome (the request went out and no answer came; SendResult.
ambiguous). The mail may be at that provider, so a second provider could deliver it twice. The row
or run records that provider (email_log.provider, digest_runs.provider) and its retries come back
pinned to it (OutgoingMail.provider): a pinned mail goes to its provider whatever its breaker says,
and waits for it (its outcome still counts for or against that breaker).

The breaker, per provider: closed → open after PROVIDER_BREAKER_FAILURES failures within
PROVIDER_BREAKER_WINDOW_SECONDS (a whole call failed, or a batch came back with mails failed
transiently or unanswered); open → after PROVIDER_BREAKER_COOLDOWN_SECONDS one batch probes it (half-open), and
its success closes the breaker, its failure opens it again. When every breaker is open, the call
fails as throttled until the first cool-down ends (nothing is lost: rows and runs wait in Postgres).

State is per process (each worker finds out on its own, within a few calls): notify_provider_
breaker_state{provider} on /metrics (0 closed, 1 half-open, 2 open; the worst of the live
processes), with when it entered that state and its recent failures (notify_provider_breaker_
changed_at, _failures, _failed_at). `status()` reads them back for `notify providers` and the
dashboard (metrics.breaker_readings: the one reader).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.platform import config, metrics, providers
from app.platform.providers.base import (
    STOPPED,
    OutgoingMail,
    PermanentError,
    Progress,
    Provider,
    ProviderError,
    SendResult,
    ThrottledError,
    _Renumbered,
)

log = logging.getLogger("app.platform.providers.failover")

CLOSED, HALF_OPEN, OPEN = "closed", "half-open", "open"
STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class Breaker:
    """One provider's circuit breaker (thread-safe; every sending thread of the process shares it)."""

    def __init__(
        self,
        name: str,
        failures: int,
        window: float,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name, self.threshold, self.window, self.cooldown, self.clock = (
            name,
            max(1, failures),
            window,
            cooldown,
            clock,
        )
        self.state = CLOSED
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()
        self._recent: deque[float] = deque()  # every failure in the window, whatever the state (published)
        self._opened_at = 0.0
        self._probing = False  # half-open: a probe is under way; nobody else is let through
        self._publish()

    def allow(self) -> bool:
        """May a batch go to this provider now? In half-open, True once: the caller is the probe and
        must report succeeded(), failed() or released()."""
        with self._lock:
            if self.state == OPEN and self.clock() - self._opened_at >= self.cooldown:
                self._set(HALF_OPEN)
            if self.state == CLOSED:
                return True
            if self.state == HALF_OPEN and not self._probing:
                self._probing = True
                return True
            return False

    def succeeded(self) -> None:
        with self._lock:
            self._probing = False
            self._failures.clear()
            if self.state != CLOSED:
                log.warning("provider %s answers again: circuit closed", self.name)
                self._set(CLOSED)

    def failed(self) -> None:
        with self._lock:
            now = self.clock()
            self._probing = False
            self._recent.append(now)
            while self._recent and now - self._recent[0] > self.window:
                self._recent.popleft()
            metrics.PROVIDER_BREAKER_FAILURES.labels(self.name).set(len(self._recent))
            metrics.PROVIDER_BREAKER_FAILED_AT.labels(self.name).set(time.time())
            if self.state == HALF_OPEN:
                self._open(now, "the probe failed")
                return
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.window:
                self._failures.popleft()
            if self.state == CLOSED and len(self._failures) >= self.threshold:
                self._open(now, f"{len(self._failures)} failures in {self.window:g} s")

    def released(self) -> None:
        """A probe that ended with no verdict (stopped before it sent anything)."""
        with self._lock:
            self._probing = False

    def reopens_in(self) -> float:
        with self._lock:
            return max(0.0, self._opened_at + self.cooldown - self.clock()) if self.state == OPEN else 0.0

    def _open(self, now: float, why: str) -> None:
        log.warning("provider %s: circuit open (%s); mail goes to the next provider", self.name, why)
        self._opened_at = now
        self._failures.clear()
        self._set(OPEN)

    def _set(self, state: str) -> None:
        self.state = state
        self._publish()

    def _publish(self) -> None:
        metrics.PROVIDER_BREAKER_STATE.labels(self.name).set(STATE_VALUES[self.state])
        metrics.PROVIDER_BREAKER_CHANGED.labels(self.name).set(time.time())


_STATE_NAMES = {value: state for state, value in STATE_VALUES.items()}


@dataclass(frozen=True)
class ProviderStatus:
    """One provider of the configured order with its breaker as this host's workers see it."""

    name: str
    breaker: str | None  # closed, half-open, open; None: one provider alone has no breaker
    since: float | None = None  # unix time it entered that state (None: not reported)
    failures: int = 0  # definite failures counted in the last PROVIDER_BREAKER_WINDOW_SECONDS
    last_failure: float | None = None  # unix time
    reported: bool = False  # False: no live process on this host has used it yet (shown closed)


def status(now: float | None = None) -> list[ProviderStatus]:
    """The providers mail goes through, in order, each with its circuit breaker as the live processes
    of this host published it (metrics.breaker_readings, the metrics directory): what `notify
    providers` prints and the dashboard shows. A breaker no live process has reported is closed —
    every worker starts that way."""
    order = providers.configured()
    if len(order) < 2:
        return [ProviderStatus(name, None) for name in order]
    readings = metrics.breaker_readings(config.get().provider_breaker_window_seconds, now)
    out = []
    for name in order:
        seen = readings.get(name)
        if seen is None:
            out.append(ProviderStatus(name, CLOSED))
            continue
        out.append(
            ProviderStatus(
                name,
                _STATE_NAMES.get(seen.state, "unknown"),
                seen.since,
                seen.failures,
                seen.last_failure,
                reported=True,
            )
        )
    return out


class FailoverProvider(Provider):
    name = "failover"

    def __init__(self, members: list[Provider]):
        """`members` in order of preference (the registry builds them from MAIL_PROVIDERS)."""
        settings = config.get()
        if not members:
            raise config.ConfigError("MAIL_PROVIDERS names no provider")
        self.members = members
        self.by_name = {m.name: m for m in members}
        self.breakers = {
            m.name: Breaker(
                m.name,
                settings.provider_breaker_failures,
                settings.provider_breaker_window_seconds,
                settings.provider_breaker_cooldown_seconds,
            )
            for m in members
        }
        self.max_batch = min(m.max_batch for m in members)
        self.preferred_batch = min(members[0].preferred_batch, self.max_batch)

    def close(self) -> None:
        for member in self.members:
            member.close()

    def states(self) -> dict[str, str]:
        return {name: b.state for name, b in self.breakers.items()}

    def deliver(self, prepared: list[tuple[OutgoingMail, OutgoingMail]], progress: Progress) -> list[SendResult]:
        mails = [m for m, _ in prepared]
        results: list[SendResult | None] = [None] * len(mails)
        pinned: dict[str, list[int]] = {}
        free: list[int] = []
        for i, m in enumerate(mails):
            if m.provider in self.by_name:
                pinned.setdefault(m.provider, []).append(i)
            else:
                if m.provider is not None:  # pinned to a provider no longer configured: nothing else knows
                    log.warning(
                        "%s is pinned to %s, which MAIL_PROVIDERS no longer names", m.idempotency_key, m.provider
                    )
                free.append(i)
        errors: list[ProviderError] = []
        for name, indexes in pinned.items():  # never moved: they may be there already
            breaker = self.breakers[name]  # not asked (they go whatever it says), but told
            try:
                self._call(self.by_name[name], indexes, mails, results, progress)
            except ProviderError as exc:
                breaker.failed()
                errors.append(exc)
                self._fail(indexes, results, progress, exc)
                continue
            self._judge(breaker, [results[i] for i in indexes])
        if free:
            self._fail_over(free, mails, results, progress, errors)
        if any(r is None for r in results):
            if errors and all(r is None for r in results):
                raise errors[-1]  # nothing of the call was answered: the caller handles the batch
            for i, r in enumerate(results):
                if r is None:
                    results[i] = STOPPED
                    progress.add(i, STOPPED)
        return [r for r in results if r is not None]

    def _fail_over(
        self,
        indexes: list[int],
        mails: list[OutgoingMail],
        results: list[SendResult | None],
        progress: Progress,
        errors: list[ProviderError],
    ) -> None:
        remaining = indexes
        for member in self.members:
            if not remaining or progress.stop_requested():
                return
            breaker = self.breakers[member.name]
            if not breaker.allow():
                continue
            try:
                self._call(member, remaining, mails, results, progress)
            except ProviderError as exc:
                breaker.failed()
                errors.append(exc)
                remaining = [i for i in remaining if results[i] is None]  # what it answered stays answered
                log.warning("%s failed for %d mail(s): %s; trying the next provider", member.name, len(remaining), exc)
                continue
            self._judge(breaker, [results[i] for i in remaining])
            return
        if not remaining or progress.stop_requested():
            return
        if not errors:  # no provider was let through: every breaker is open
            wait = min(b.reopens_in() for b in self.breakers.values())
            errors.append(ThrottledError("every provider's circuit breaker is open", retry_after=max(1.0, wait)))
        if any(r is not None for r in results):
            self._fail(remaining, results, progress, errors[-1])

    def _call(
        self,
        member: Provider,
        indexes: list[int],
        mails: list[OutgoingMail],
        results: list[SendResult | None],
        progress: Progress,
    ) -> None:
        sub = _Share(progress, indexes, results)
        answered = member.send_batch([mails[i] for i in indexes], sub)
        for k, result in enumerate(answered):
            results[indexes[k]] = result

    @staticmethod
    def _judge(breaker: Breaker, outcomes: list[SendResult | None]) -> None:
        """A call that returned: its mails' outcomes are the provider's verdict."""
        if all(r is not None and r.stopped for r in outcomes):
            breaker.released()  # stopped before it sent anything: no verdict
        elif any(r is not None and _trouble(r) for r in outcomes):
            breaker.failed()  # those mails stay where they are (retried later; ambiguous ones pinned)
        else:
            breaker.succeeded()

    @staticmethod
    def _fail(indexes: list[int], results: list[SendResult | None], progress: Progress, exc: ProviderError) -> None:
        permanent = isinstance(exc, PermanentError)
        for i in indexes:
            if results[i] is None:
                results[i] = failed = SendResult(ok=False, error=str(exc)[:1000], permanent=permanent)
                progress.add(i, failed)


def _trouble(result: SendResult) -> bool:
    """A mail the provider did not take, or did not answer for, for a reason of its own (not the
    recipient's, not a stop). It counts against the breaker, so new mail goes elsewhere; the mail
    itself never moves (an ambiguous one is pinned to this provider)."""
    return not (result.ok or result.permanent or result.stopped)


class _Share(_Renumbered):
    """The failover call's Progress seen by one member: its numbering mapped back (base.py's
    _Renumbered; the member's own send_batch names the provider), and each result kept as it
    arrives (so a member that fails after answering some mails leaves those answered)."""

    def __init__(self, outer: Progress, indexes: list[int], results: list[SendResult | None]):
        super().__init__(outer, indexes, None)
        self._results = results

    def add(self, index: int, result: SendResult) -> None:
        self._results[self._positions[index]] = result
        super().add(index, result)
