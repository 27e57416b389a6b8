"""Claims a live process holds, renewed so that no reclaimer hands them to another worker.

A newsletter chain claims outbox rows (`sending`), a digest batch claims runs (`processing`). The
newsletter reclaimer and the digest watchdog give back rows claimed longer ago than their timeout
(RECLAIM_AFTER_SECONDS, DIGEST_PROCESSING_TIMEOUT_SECONDS): their worker died, and what it may
have handed to the provider is sent again with the same idempotency key. A live worker must never
lose its rows that way — not while a batch is slow, not while Postgres is away and the outcomes it
holds wait to be written (db.until_written). So while a claim is open here, a background thread of
the process renews it (claimed_at = now(), one statement of the owning domain) once it is a third
of its timeout old, and every third after. Rows are taken back only when their holder stopped
renewing: it died, or it could not reach Postgres for a whole timeout while the reclaimer could.

After an outage every claim looks old, the live ones too: the scheduler runs the reclaimers only
once it has seen the database for GRACE_SECONDS without a break (app/cli/scheduler.py), time enough
for every live holder to renew (it checks every CHECK_SECONDS, and reconnects on the first try).

A renewal skips rows locked at that moment (their outcome is being written): it never waits, so it
cannot deadlock with its holder's own writes. Renewing costs nothing while batches are quick: a
claim younger than a third of the timeout is never touched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.platform import db

log = logging.getLogger("app.platform.holds")

CHECK_SECONDS = 1.0  # how often the renewer looks for claims due
GRACE_SECONDS = 10.0  # after an outage, the reclaimers wait this long for live holders to renew
# Dramatiq's time limit for an actor that holds claims: it may wait for Postgres that long with
# outcomes in hand. Not the claim timeout (as it was): a live holder keeps its rows past it. An outage
# longer than an hour is no blink: the actor is interrupted, its claim closed, the rows go back.
SEND_ACTOR_TIME_LIMIT_MS = 60 * 60_000

Renew = Callable[[db.Cursor, list[int]], int]  # (cursor, ids) -> rows renewed


class Hold:
    """One open claim: `ids` of rows this process holds, renewed by `renew` until close()."""

    def __init__(self, what: str, ids: list[int], renew: Renew, timeout_seconds: float):
        self.what, self.ids, self.renew = what, sorted(ids), renew
        self.every = max(0.0, timeout_seconds) / 3
        self.renewed = time.monotonic()  # the claim itself
        self.failing = False

    def due(self, now: float) -> bool:
        return now - self.renewed >= self.every

    def close(self) -> None:
        with _lock:
            _holds.discard(self)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_lock = threading.Lock()
_holds: set[Hold] = set()
_renewer: threading.Thread | None = None


def hold(what: str, ids: list[int], renew: Renew, timeout_seconds: float) -> Hold:
    """Hold `ids` (just claimed) until the returned Hold is closed: renewed meanwhile."""
    global _renewer
    held = Hold(what, ids, renew, timeout_seconds)
    if not held.ids:
        return held
    with _lock:
        _holds.add(held)
        if _renewer is None or not _renewer.is_alive():  # lazily, and again in a forked child
            _renewer = threading.Thread(target=_renew_forever, name="claim-renewer", daemon=True)
            _renewer.start()
    return held


def held() -> list[Hold]:
    """The claims open in this process (for tests and logs)."""
    with _lock:
        return list(_holds)


def renew_due(now: float | None = None) -> int:
    """Renew every claim due (on the calling thread's connection); how many rows were renewed."""
    now = time.monotonic() if now is None else now
    renewed = 0
    for held_ in sorted((h for h in held() if h.due(now)), key=lambda h: h.renewed):
        try:
            renewed += db.thread_connection.call(held_.renew, held_.ids)
        except db.UNAVAILABLE as exc:
            db.thread_connection.reset()
            if not held_.failing:
                log.warning("cannot renew the claim on %d %s yet: %s; retrying", len(held_.ids), held_.what, exc)
            held_.failing = True
            return renewed  # the others would fail the same way: next check
        except Exception:
            db.thread_connection.reset()
            log.exception("renewing the claim on %d %s failed; retrying", len(held_.ids), held_.what)
            continue
        if held_.failing:
            log.warning("the claim on %d %s is renewed again", len(held_.ids), held_.what)
        held_.renewed, held_.failing = now, False
    return renewed


def _renew_forever() -> None:
    while True:
        time.sleep(CHECK_SECONDS)
        try:
            renew_due()
        except Exception:  # never let the renewer die: every live claim depends on it
            log.exception("claim renewer: unexpected error")
