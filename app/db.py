"""Database access: peewee's connection pool plus raw psycopg2 connections for the hot paths.

The SQL files in sql/migrations are the schema. peewee is used for its pool
(PooledPostgresqlExtDatabase: `query`, `database.atomic()`) in the admin API, pages and
operator commands; it has no models here — they were never queried and had drifted from the
schema. The hot paths (claims, marks, group commits, click history) use plain psycopg2 on
connections a worker thread keeps (ThreadConnections) or a writer thread owns, because they need
execute_values, COPY, arrays as literals and explicit transactions that an ORM would only wrap.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from urllib.parse import urlparse

import psycopg2
import psycopg2.extras
import tenacity
import peewee
from playhouse.db_url import parse as parse_db_url
from playhouse.pool import MaxConnectionsExceeded
from playhouse.postgres_ext import PooledPostgresqlExtDatabase

from app import config

log = logging.getLogger("app.db")

database = PooledPostgresqlExtDatabase(None, autoconnect=True)

# Every way "the database is not answering" surfaces: a refused or dropped connection (psycopg2 or
# peewee's wrappers), or no pooled connection free within DB_POOL_TIMEOUT_SECONDS.
UNAVAILABLE = (psycopg2.OperationalError, psycopg2.InterfaceError, peewee.OperationalError,
               peewee.InterfaceError, MaxConnectionsExceeded)
_bound_url: str | None = None


def init(url: str | None = None) -> PooledPostgresqlExtDatabase:
    """Point the shared peewee database at DATABASE_URL (idempotent)."""
    global _bound_url
    settings = config.get()
    url = url or settings.database_url
    if _bound_url == url:
        return database
    if _bound_url is not None:
        database.close_all()
    params = parse_db_url(url)
    name = params.pop("database")
    database.connect_params.clear()   # peewee's init() merges: a port from the old URL would stick
    # timeout: a burst of threadpool requests waits for a free connection instead of failing.
    database.init(name, max_connections=settings.db_pool_size, stale_timeout=300,
                  timeout=settings.db_pool_timeout_seconds, **params)
    _bound_url = url
    return database


def connect_raw(url: str | None = None, autocommit: bool = False):
    """A plain psycopg2 connection, for bulk writers that must own their transaction."""
    conn = psycopg2.connect(url or config.get().database_url)
    conn.autocommit = autocommit
    return conn


class ThreadConnections:
    """One raw psycopg2 connection per thread, kept open across calls (opening one per message
    would cost more than the work it serves); reopened when closed or DATABASE_URL changed."""

    def __init__(self, autocommit: bool = False):
        self.autocommit = autocommit
        self._local = threading.local()

    def get(self):
        url = config.get().database_url
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or self._local.url != url):
            self.reset()
            conn = None
        if conn is None:
            conn = connect_raw(url, autocommit=self.autocommit)
            self._local.conn, self._local.url = conn, url
        return conn

    def reset(self) -> None:
        """Drop this thread's connection (after an error that may have left it in an unknown state)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to release
                pass

    def retry_once(self, work):
        """work(connection). A connection that died while kept open (server restart, idle
        timeout) is reopened and the work tried once more: only for idempotent work."""
        for attempt in (1, 2):
            try:
                return work(self.get())
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self.reset()
                if attempt == 2:
                    raise
                log.warning("database connection lost; reconnecting")


@contextlib.contextmanager
def transaction(conn):
    """A cursor whose work commits on success and rolls back on error. A connection that cannot
    even roll back (the server went away) is closed, so its owner reopens it next time."""
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        try:
            conn.rollback()
        except psycopg2.Error:
            conn.close()
        raise


@contextlib.contextmanager
def raw_cursor(url: str | None = None):
    """Short-lived connection + cursor, committed on success, rolled back on error."""
    conn = connect_raw(url)
    try:
        with transaction(conn) as cur:
            yield cur
    finally:
        conn.close()


def write_deadline(claimed_at: float, timeout_seconds: float) -> float:
    """Until when a worker keeps retrying the write of outcomes it claimed at `claimed_at`
    (time.monotonic()): comfortably before the watchdog or reclaimer may take the rows back after
    `timeout_seconds` — 30 s before, or a fifth of the timeout when that is shorter."""
    return claimed_at + timeout_seconds - min(30.0, timeout_seconds / 5)


def until_written(work, deadline: float, what: str):
    """work() — a write whose outcome must not be lost (mail the provider already accepted) —
    retried while the database is unavailable, with backoff, until `deadline` (time.monotonic()).
    Past it the last error is raised: the caller's rows are then returned by the watchdog or the
    reclaimer, whose timeouts are chosen to come after this deadline."""
    def log_wait(state):
        log.warning("%s: database unavailable (%s); retrying in %.1f s", what, state.outcome.exception(),
                    state.next_action.sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(UNAVAILABLE),
        stop=tenacity.stop_before_delay(max(0.0, deadline - time.monotonic())),
        wait=tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0),
        before_sleep=log_wait, reraise=True)
    return retrying(work)


def database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/") or "postgres"


ALL_TABLES = [
    "api_keys", "subscribers", "digest_runs", "digest_events", "newsletters", "email_log",
    "email_links", "email_link_history", "legacy_link_codes", "webhook_events", "suppressions",
    "mail_event_counts",
]


def query(sql: str, params=None) -> list[tuple]:
    """One statement on a pooled connection (autocommit); returns rows if any."""
    with database.connection_context():
        cursor = database.execute_sql(sql, params)
        return cursor.fetchall() if cursor.description else []
