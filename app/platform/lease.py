"""Leases: a row in `leases` saying which process holds a role until when.

Used where one process at a time should do something that spans many transactions: the
scheduler's leadership (app/cli/scheduler.py) and a newsletter's outbox builder
(app/newsletter/outbox.py). A session advisory lock would do it on a direct connection, but behind
PgBouncer in transaction pooling mode a session is not the client's: the lock would be taken on one
server connection and stay there, held for whoever is lent it next. A lease is plain rows and one
statement per renewal, so it works through any pooler.

  * acquire or renew is one statement (an upsert whose update only happens when the row is ours or
    expired), judged by the database's clock — the holders' clocks never matter;
  * a holder renews from a background thread every third of the lease, so a long piece of work (a
    first planning tick over a million subscribers) never loses it;
  * a holder that dies stops renewing; another takes over once the lease has expired (at most
    `seconds` later, plus its own polling period). A clean stop deletes the row: immediate takeover;
  * a holder that cannot renew (database unreachable) stops believing it holds the lease when its
    own copy of the expiry passes: never later than anyone else could take over.

Whatever runs under a lease is still idempotent (unique keys, ON CONFLICT, SKIP LOCKED): a lease
makes duplicate work rare, it is not what keeps the data right.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time

from app.platform import db

log = logging.getLogger("app.platform.lease")

ACQUIRE = """
INSERT INTO leases (name, holder, expires_at) VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
       acquired_at = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.acquired_at ELSE now() END
 WHERE leases.holder = EXCLUDED.holder OR leases.expires_at < now()
RETURNING holder"""
RELEASE = "DELETE FROM leases WHERE name = %s AND holder = %s"


def new_holder_id() -> str:
    """Unique per Lease object: host, pid (for an operator reading the table) and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Lease:
    """One named lease, for one would-be holder. Thread-safe."""

    def __init__(self, name: str, seconds: float, holder: str | None = None):
        if seconds <= 0:
            raise ValueError("a lease lasts a positive number of seconds")
        self.name, self.seconds = name, float(seconds)
        self.holder = holder or new_holder_id()
        self._lock = threading.Lock()
        self._until = 0.0  # time.monotonic() after which we no longer hold it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """Acquire, or renew if ours: one statement. False if another holds a live lease, or if
        the database could not be asked (logged)."""
        with self._lock:
            sent = time.monotonic()  # the database's expiry is later than sent + seconds
            try:
                rows = db.query(ACQUIRE, {"name": self.name, "holder": self.holder, "seconds": self.seconds})
            except Exception as exc:
                log.warning("lease %s: could not acquire or renew: %s", self.name, exc)
                return self.held()
            if rows:
                self._until = sent + self.seconds
                return True
            self._until = 0.0
            return False

    def held(self) -> bool:
        return time.monotonic() < self._until

    def acquire(self, wait: float) -> bool:
        """try_acquire() until it succeeds or `wait` seconds have passed (a dead holder's lease
        expires within `seconds`; a live holder keeps renewing it)."""
        deadline = time.monotonic() + wait
        while True:
            if self.try_acquire():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, max(0.05, self.seconds / 10)))

    def keep(self) -> None:
        """From a daemon thread, every third of the lease: renew it while held, try to take it
        while not (a standby scheduler waits this way). Stopped by release()."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period = self.seconds / 3
        while not self._stop.wait(period):
            self.try_acquire()

    def stop_renewing(self) -> None:
        """Stop the thread; the lease runs out by itself (what a crash looks like to others)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def release(self) -> None:
        """Stop renewing and give the lease up now (when ours), so another takes over at once."""
        self.stop_renewing()
        with self._lock:
            was_held, self._until = self.held(), 0.0
            try:
                db.query(RELEASE, (self.name, self.holder))
            except Exception as exc:  # it expires by itself
                if was_held:
                    log.warning(
                        "lease %s: could not release (it expires within %.0f s): %s", self.name, self.seconds, exc
                    )

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
