"""What the HTTP API providers (SES, Postmark, Mailgun) share: one httpx client each, the status
mapping, which failures are definite and which ambiguous, and sending one mail per request on a few
threads (SES and Mailgun take one MIME message per call).

Definite or ambiguous — the line failover must not cross (base.AmbiguousError):
  - definite: the provider cannot have accepted the mail. A connection that was never made
    (refused, DNS, connect timeout, no pooled connection free), a request that was not written
    out in full, or an answer: 429, 5xx (but 504), 4xx.
  - ambiguous: the whole request went out and no answer came back — a read timeout, the connection
    dropped before the status line, or a 504 from a gateway that gave up waiting for the provider
    behind it. The provider may have accepted it: only the same provider may try again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from app.platform.providers.base import (
    STOPPED,
    AmbiguousError,
    OutgoingMail,
    PermanentError,
    Progress,
    ProviderError,
    SendResult,
    ThrottledError,
    TransientError,
)

log = logging.getLogger("app.platform.providers.http_api")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request is noise

# Never written in full, or never connected: the provider has nothing to accept.
_DEFINITE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError, httpx.WriteTimeout)
# Requests of one batch under way at once, for APIs that take one mail per request (a 50 ms round
# trip and 16 lanes: ~300 mails/s per sending thread).
LANES = 16
POOL_THREADS = 64


def client(timeout: float) -> httpx.Client:
    """One pooled client per provider instance: keep-alive connections reused across batches."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
        limits=httpx.Limits(max_connections=POOL_THREADS, max_keepalive_connections=POOL_THREADS),
    )


def request(http: httpx.Client, name: str, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One call; a transport failure raised as TransientError (definite) or AmbiguousError."""
    try:
        response = http.request(method, url, **kwargs)
    except _DEFINITE as exc:
        raise TransientError(f"cannot reach {name}: {exc!r}") from exc
    except httpx.TransportError as exc:  # read timeout, dropped connection, protocol error after sending
        raise AmbiguousError(f"no answer from {name} after sending (it may have accepted): {exc!r}") from exc
    response.read()
    # Break the response <-> stream reference cycle (sendgrid._release): freed by refcount, not the GC.
    response.stream = httpx.ByteStream(b"")
    return response


class Refused(Exception):
    """This one mail is refused (a 400 naming it): it fails alone, permanently."""


def raise_for_status(name: str, response: httpx.Response, detail: str, *, per_mail: tuple[int, ...] = ()) -> None:
    """2xx: return. Statuses in `per_mail` raise Refused (that mail alone). Otherwise the call's error:
    429 ThrottledError, 504 AmbiguousError, 5xx TransientError, other 4xx PermanentError."""
    status = response.status_code
    if 200 <= status < 300:
        return
    text = f"{name} {status}: {detail}"[:500]
    if status in per_mail:
        raise Refused(text)
    if status == 429:
        raise ThrottledError(text, retry_after=retry_after(response))
    if status == 504:
        raise AmbiguousError(f"{text} (a gateway gave up waiting: {name} may have accepted)")
    if status >= 500:
        raise TransientError(text)
    raise PermanentError(text)


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class OnePerRequest:
    """Sends a batch as one request per mail, LANES at a time, for SES and Mailgun.

    `send_one(mail, prepared) -> SendResult` answers for its mail or raises:
      - Refused: that mail fails alone (permanently);
      - AmbiguousError: that mail's outcome is unknown (SendResult ambiguous); the batch goes on;
      - any other ProviderError: the provider is not taking mail (throttled, down, credentials):
        no further mail of the batch is started. If nothing of the batch was accepted, the error is
        the whole call's (raised, so the caller and failover see the provider fail); otherwise the
        mails not sent get it as their result.
    A stop request is honoured between two mails."""

    def __init__(self, name: str, lanes: int = LANES):
        self.name, self.lanes = name, max(1, lanes)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                # Shared by the process's sending threads, each running up to `lanes` at once: as
                # many threads as the client keeps connections (http_api.client).
                self._executor = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=self.name)
            return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def deliver(
        self,
        prepared: list[tuple[OutgoingMail, Any]],
        progress: Progress,
        send_one: Callable[[OutgoingMail, Any], SendResult],
    ) -> list[SendResult]:
        results: list[SendResult | None] = [None] * len(prepared)
        failure: list[ProviderError] = []  # the first whole-call error; no mail starts after it
        next_index = iter(range(len(prepared)))
        take = threading.Lock()

        def lane() -> None:
            while True:
                progress.poll()  # on the calling thread only: record what arrived, read the stop
                with take:
                    i = next(next_index, None)
                    halt = bool(failure) or progress.stop_requested()
                if i is None:
                    return
                if halt:
                    results[i] = None  # filled in below: stopped, or the whole call's error
                    continue
                mail, item = prepared[i]
                try:
                    result = send_one(mail, item)
                except Refused as exc:
                    result = SendResult(ok=False, error=str(exc), permanent=True)
                except AmbiguousError as exc:
                    result = SendResult(ok=False, error=str(exc)[:1000], ambiguous=True)
                except ProviderError as exc:
                    with take:
                        failure.append(exc)
                    continue
                except Exception as exc:  # a bug or an odd answer: this mail retries later, the batch goes on
                    log.exception("%s: unexpected error sending %s", self.name, mail.idempotency_key)
                    result = SendResult(ok=False, error=f"unexpected {self.name} error: {exc!r}"[:1000])
                results[i] = result
                progress.add(i, result)

        lanes = min(self.lanes, len(prepared))
        if lanes <= 1:
            lane()
        else:
            futures = [self._pool().submit(lane) for _ in range(lanes)]
            for future in futures:
                future.add_done_callback(lambda _: progress.wake())
            while not all(f.done() for f in futures):
                progress.wait(time.monotonic() + 1.0)
                progress.poll()  # on the calling thread: record what arrived, read the stop
            for future in futures:
                future.result()
        if failure:
            exc = failure[0]
            if not any(r is not None and (r.ok or r.ambiguous) for r in results):
                raise exc  # nothing accepted, nothing maybe-accepted: the whole call failed
            permanent = isinstance(exc, PermanentError)
            for i, r in enumerate(results):
                if r is None:
                    results[i] = SendResult(ok=False, error=f"{self.name}: {exc}"[:1000], permanent=permanent)
                    progress.add(i, results[i])  # type: ignore[arg-type]
        for i, r in enumerate(results):
            if r is None:
                results[i] = STOPPED
                progress.add(i, STOPPED)
        return [r for r in results if r is not None]
