"""A group-commit writer: many concurrent requests share one INSERT + COMMIT, and each request's
future resolves only after that commit (so a 2xx really means committed).

One thread and one connection per writer; it gathers what is waiting
for at most `wait_ms`. The SQL is a callback; deadlocks and serialization failures
are retried with progressive backoff, other errors are never swallowed (a group that fails is
retried request by request so one bad request cannot fail its neighbours, and the error reaches
the request that caused it), and an `after_commit` hook runs only after a successful commit.

Kept over the plain alternative (each request: execute_values on a pooled connection, commit) for
what the API mostly gets, many small requests: `scripts/bench/groupcommit.py` measures both
(BENCHMARKS.md, "group-commit writer"). For a few large batches the plain way is faster (one
writer thread serialises what pooled connections do in parallel), so very large batches are a
candidate for bypassing the group.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import psycopg2
import psycopg2.errors

from app.platform import config, db

log = logging.getLogger("app.platform.groupcommit")

RETRYABLE = (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure)


class GroupCommitWriter:
    def __init__(
        self,
        name: str,
        commit_jobs: Callable,
        after_commit: Callable | None = None,
        url: str | None = None,
        wait_ms: float = 1.0,
        max_items: int = 20_000,
        retries: int = 6,
        backoff_base: float = 0.02,
        connect: Callable | None = None,
    ):
        """commit_jobs(cursor, jobs) -> one result per job, inside the writer's transaction.
        after_commit(jobs, results) runs on the writer thread after the commit (errors logged)."""
        self.name = name
        self._commit_jobs, self._after_commit = commit_jobs, after_commit
        self._url, self._connect = url, connect
        self._wait, self._max_items = wait_ms / 1000, max_items
        self._retries, self._backoff_base = retries, backoff_base
        self._queue: queue.Queue = queue.Queue()
        self._conn = None
        self._conn_url: str | None = None
        self.retried = 0  # deadlocks/serialization failures seen (observability, tests)
        self._thread = threading.Thread(target=self._run, name=f"{name}-writer", daemon=True)
        self._thread.start()

    def submit(self, job, size: int = 1) -> Future:
        fut: Future = Future()
        self._queue.put((job, size, fut))
        return fut

    def _connection(self):
        url = self._url or config.get().database_url  # follows DATABASE_URL, like db.thread_connection
        if self._conn is not None and not self._conn.closed and url != self._conn_url:
            self._conn.close()
        if self._conn is None or self._conn.closed:
            self._conn = self._connect() if self._connect else db.connect_raw(url)
            self._conn_url = url
        return self._conn

    def _gather(self) -> list:
        first = self._queue.get()
        group, size = [first], first[1]
        deadline = time.monotonic() + self._wait
        while size < self._max_items:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            group.append(item)
            size += item[1]
        return group

    def _commit_once(self, jobs: list) -> list:
        with db.transaction(self._connection()) as cur:
            return self._commit_jobs(cur, jobs)

    def commit(self, jobs: list) -> list:
        """Commit jobs in one transaction, retrying deadlocks/serialization failures with
        progressive, jittered backoff. Anything else propagates."""
        attempt = 0
        while True:
            try:
                return self._commit_once(jobs)
            except RETRYABLE as exc:
                attempt += 1
                self.retried += 1
                if attempt > self._retries:
                    raise
                delay = self._backoff_base * (2 ** (attempt - 1)) * (0.5 + random.random())
                log.warning("%s: %s, retry %d in %.3fs", self.name, exc.__class__.__name__, attempt, delay)
                time.sleep(delay)

    def _finish(self, items: list, results: list) -> None:
        for (_, _, fut), result in zip(items, results):
            fut.set_result(result)
        if self._after_commit:
            try:
                self._after_commit([job for job, _, _ in items], results)
            except Exception:
                log.exception("%s: after-commit hook failed (committed data is safe)", self.name)

    def _run(self) -> None:
        while True:
            group = self._gather()
            try:
                results = self.commit([job for job, _, _ in group])
            except Exception as exc:
                if len(group) == 1:
                    log.error("%s: commit failed: %s", self.name, exc)
                    group[0][2].set_exception(exc)
                    continue
                for item in group:
                    try:
                        self._finish([item], self.commit([item[0]]))
                    except Exception as one_exc:
                        log.error("%s: commit failed: %s", self.name, one_exc)
                        item[2].set_exception(one_exc)
                continue
            self._finish(group, results)


class OnFirstUse:
    """This process's writer, built on first use — after uvicorn forked its workers, so no child
    inherits a parent's thread or connection. `instance` is the writer once built."""

    def __init__(self, factory: Callable[[], GroupCommitWriter]):
        self._factory, self._lock = factory, threading.Lock()
        self.instance: GroupCommitWriter | None = None

    def __call__(self) -> GroupCommitWriter:
        if self.instance is None:
            with self._lock:
                if self.instance is None:
                    self.instance = self._factory()
        return self.instance
