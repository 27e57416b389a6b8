"""Database access: the one way to the database (docs/database.md). No module above the platform
imports psycopg2 or peewee; they call this module's API.

The SQL files in sql/migrations are the schema; there are no ORM models (they were never queried
and had drifted from the schema). Every connection comes from `connect_raw()`, the one factory
(it also counts what it opened: `connections_opened()`). There are three ways to hold one:

1. The pool — peewee's PooledPostgresqlExtDatabase, kept for its pool alone (DB_POOL_SIZE
   connections per process, DB_POOL_TIMEOUT_SECONDS to wait for one) — for every short-lived unit
   of work: a web request, a CLI command, a scheduler job. The connection is the calling thread's
   for the unit and goes back to the pool after it; a connection that does not answer when handed
   out (peewee pings it) or whose server went away during the unit is discarded.
     * `query(sql, params)`: one statement, autocommit; its rows.
     * `call(work, *args)`: work(cursor, *args), autocommit (a domain's statement function).
     * `raw_cursor()`: a cursor inside `transaction()` — several statements that commit or roll
       back together.

2. `thread_connection` — a worker thread's kept connection across messages (digest sending,
   newsletter sending, link recording, webhook apply): opening or even checking one out per
   message would cost more than the work it serves. One per thread, autocommit like the pool's
   (so `transaction(conn)` groups statements, as a savepoint when one is already open).
   `thread_connection.run(sql)`: one statement, and `.call(work, …)`: a domain's statement
   function on its cursor; each reopened once when the server went away
   (`retry_once(work)`: idempotent work only); `reset()` drops it after an error that may have
   left it in an unknown state. It follows DATABASE_URL.

3. Owned connections, `connect_raw()` kept by one owner, where a thread writes a stream of
   transactions of its own: the group-commit writer threads (app/platform/groupcommit.py) and the
   click-history writer (tracking/recorder.py). The migrator (app/platform/migrate.py) is the one
   user whose *session* matters (an advisory lock, a session lock_timeout around CREATE INDEX
   CONCURRENTLY), and it connects to MIGRATION_DATABASE_URL when that is set.

`execute_values(cur, …)` sends many rows in one statement per page; `json(value)` is a jsonb
parameter; `Error`, `LockNotAvailable`, … are the driver's errors callers catch. `until_written`
retries a write whose outcome must not be lost while the database is unavailable.

Nothing else keeps state in a session, so everything but the migrator works behind PgBouncer in
transaction pooling mode (README "Running behind PgBouncer"; `make test` runs the integration tests
through one): settings that must hold for a unit of work are `SET LOCAL` inside its transaction,
temp tables are created in the transaction that uses them, roles held across transactions (the
scheduler's leadership, a newsletter's outbox builder) are lease rows (app/platform/lease.py), not
advisory locks, and there are no LISTEN/NOTIFY, WITH HOLD cursors or named prepared statements
(psycopg2 sends every query as plain text).

Why plain SQL rather than peewee queries: the hot paths are `FOR UPDATE SKIP LOCKED` claims,
`INSERT … SELECT … ON CONFLICT`, execute_values, COPY and arrays as literals — SQL an ORM would only
wrap — and each has to pick its transaction boundaries (never open across an SMTP call).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar
from urllib.parse import urlparse

import peewee
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import tenacity
from playhouse.pool import MaxConnectionsExceeded, _PooledPostgresqlDatabase
from playhouse.postgres_ext import PostgresqlExtDatabase

from app.platform import config

log = logging.getLogger("app.platform.db")

# Every way "the database is not answering" surfaces: a refused or dropped connection (psycopg2 or
# peewee's wrappers), or no pooled connection free within DB_POOL_TIMEOUT_SECONDS.
UNAVAILABLE = (
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    peewee.OperationalError,
    peewee.InterfaceError,
    MaxConnectionsExceeded,
)

# A cursor, as the modules above annotate one (the driver ships no types: this is Any to mypy).
Cursor: TypeAlias = psycopg2.extensions.cursor
T = TypeVar("T")

# The errors callers catch, named here so that no module above the platform imports psycopg2.
Error = psycopg2.Error
DataError = psycopg2.DataError
IntegrityError = psycopg2.IntegrityError
LockNotAvailable = psycopg2.errors.LockNotAvailable
UniqueViolation = psycopg2.errors.UniqueViolation
QueryCanceled = psycopg2.errors.QueryCanceled

_IN_TRANSACTION = psycopg2.extensions.TRANSACTION_STATUS_INTRANS
_IN_ERROR = psycopg2.extensions.TRANSACTION_STATUS_INERROR
_opened = 0
_opened_lock = threading.Lock()
_opened_here = threading.local()


def connect_raw(url: str | None = None, autocommit: bool = False):
    """The one connection factory: a new psycopg2 connection to `url` (default DATABASE_URL). The
    pool, the worker threads' kept connections and the owned ones all come from here."""
    global _opened
    conn = psycopg2.connect(url or config.get().database_url)
    conn.autocommit = autocommit
    with _opened_lock:
        _opened += 1
    _opened_here.count = getattr(_opened_here, "count", 0) + 1
    return conn


def connections_opened(this_thread: bool = False) -> int:
    """How many connections this process (or only the calling thread) has opened (observability,
    tests: a background thread's reconnect must not count against the thread under test)."""
    return getattr(_opened_here, "count", 0) if this_thread else _opened


class _FromFactory(PostgresqlExtDatabase):
    def _connect(self):
        # peewee sends BEGIN/COMMIT itself and requires autocommit; self.database is the URL.
        return connect_raw(self.database, autocommit=True)


# Called with (seconds waited, timed out) after every pool check-out: app/platform/metrics.py registers the
# pool-wait histogram here (metrics imports this module, so it cannot be called from here directly).
checkout_observers: list = []


class Pool(_PooledPostgresqlDatabase, _FromFactory):
    """peewee's Postgres pool (playhouse.pool: bounded, waits, pings on check-out, discards broken
    connections on check-in) whose new connections come from connect_raw()."""

    def connect(self, reuse_if_open=False):
        started = time.perf_counter()
        try:
            opened = super().connect(reuse_if_open)
        except MaxConnectionsExceeded:
            _observe_checkout(time.perf_counter() - started, True)
            raise
        if opened:  # False: this thread already held its connection, nothing was checked out
            _observe_checkout(time.perf_counter() - started, False)
        return opened


def _observe_checkout(seconds: float, timed_out: bool) -> None:
    for observe in checkout_observers:
        observe(seconds, timed_out)


database = Pool(None, autoconnect=True)
_bound_url: str | None = None
_bind_lock = threading.Lock()


def init(url: str | None = None) -> Pool:
    """Point the pool at `url` (default DATABASE_URL); idempotent. A different URL closes the
    old pool's connections first."""
    global _bound_url
    settings = config.get()
    url = url or settings.database_url
    if _bound_url == url:
        return database
    with _bind_lock:
        if _bound_url != url:
            if _bound_url is not None:
                database.close_all()
            # timeout: a burst of threadpool requests waits for a free connection instead of failing.
            database.init(
                url, max_connections=settings.db_pool_size, stale_timeout=300, timeout=settings.db_pool_timeout_seconds
            )
            _bound_url = url
    return database


def _pool() -> Pool:
    return database if _bound_url is not None else init()


@contextlib.contextmanager
def transaction(conn):
    """The one transaction helper: a cursor whose work commits on success and rolls back on error.

    Works on the pool's and the worker threads' connections (autocommit, as peewee keeps them: BEGIN
    and COMMIT are sent here) and on owned ones without autocommit. Inside a transaction already
    open on `conn` it is a savepoint: the inner work rolls back alone, the outer one commits it.
    A transaction that an error aborted is never reported as committed. A connection that cannot
    even roll back (the server went away) is closed: the pool discards it, its owner reopens it."""
    if conn.get_transaction_status() in (_IN_TRANSACTION, _IN_ERROR):
        with _savepoint(conn) as cur:
            yield cur
        return
    explicit = conn.autocommit
    try:
        with conn.cursor() as cur:
            if explicit:
                cur.execute("BEGIN")
            yield cur
            _refuse_aborted(conn)
            if explicit:
                cur.execute("COMMIT")
        if not explicit:
            conn.commit()
    except BaseException:
        _rollback(conn, "ROLLBACK")
        raise


@contextlib.contextmanager
def _savepoint(conn):
    with conn.cursor() as cur:
        cur.execute("SAVEPOINT db_transaction")
        try:
            yield cur
            _refuse_aborted(conn)
        except BaseException:
            _rollback(conn, "ROLLBACK TO SAVEPOINT db_transaction", "RELEASE SAVEPOINT db_transaction")
            raise
        cur.execute("RELEASE SAVEPOINT db_transaction")


def _refuse_aborted(conn) -> None:
    # Postgres answers COMMIT in an aborted transaction with ROLLBACK, and psycopg2 does not raise:
    # work whose error was caught inside the block would silently vanish.
    if conn.get_transaction_status() == _IN_ERROR:
        raise psycopg2.errors.InFailedSqlTransaction("an error inside the transaction aborted it; nothing committed")


def _rollback(conn, *statements: str) -> None:
    """Send the statements (conn.rollback() is a no-op in autocommit); close a connection that
    cannot take them."""
    try:
        if conn.autocommit or statements[0] != "ROLLBACK":
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        else:
            conn.rollback()
    except psycopg2.Error:
        conn.close()


@contextlib.contextmanager
def raw_cursor():
    """A transaction (`transaction()`) on a pooled connection, for one short unit of work."""
    pool = _pool()
    with pool.connection_context(), transaction(pool.connection()) as cur:
        yield cur


def query(sql: str, params=None) -> list[Any]:
    """One statement on a pooled connection (autocommit); returns rows if any."""
    pool = _pool()
    with pool.connection_context():
        cursor = pool.execute_sql(sql, params)
        return cursor.fetchall() if cursor.description else []


def call(work: Callable[..., T], *args: Any) -> T:
    """work(cursor, *args) on a pooled connection in autocommit: a domain's statement function (say
    app/newsletter/rows.py `pause`) as its own transaction, without a BEGIN and COMMIT around it."""
    pool = _pool()
    with pool.connection_context(), pool.connection().cursor() as cur:
        return work(cur, *args)


def execute_values(cur, sql: str, rows, template: str | None = None, page_size: int = 100, fetch: bool = False):
    """`INSERT … VALUES %s` / `FROM (VALUES %s)` for many rows on `cur`: page_size rows per
    statement (page_size=len(rows): one round trip). With fetch, the rows every page returned."""
    return psycopg2.extras.execute_values(cur, sql, rows, template=template, page_size=page_size, fetch=fetch)


def json(value) -> psycopg2.extras.Json:
    """A parameter sent as JSON (a jsonb column)."""
    return psycopg2.extras.Json(value)


def close_all() -> None:
    """Close every pooled connection (shutdown; a test that restarts the server)."""
    database.close_all()


class ThreadConnection:
    """A worker thread's kept connection (see the module docstring): one per thread, reopened when
    closed or when DATABASE_URL changed. A thread that ends takes its connection with it."""

    def __init__(self):
        self._local = threading.local()

    def get(self):
        url = config.get().database_url
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or self._local.url != url):
            self.reset()
            conn = None
        if conn is None:
            conn = connect_raw(url, autocommit=True)
            self._local.conn, self._local.url, self._local.opened = conn, url, time.monotonic()
        return conn

    def connected_seconds(self) -> float:
        """How long this thread's connection has been open (0 without one): a connection the
        server dropped (a restart, an outage) is reopened by the next statement, so this is how long
        this thread has seen the database without a break."""
        if getattr(self._local, "conn", None) is None:
            return 0.0
        return time.monotonic() - self._local.opened

    def reset(self) -> None:
        """Drop this thread's connection (after an error that may have left it in an unknown state)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to release
                pass

    def retry_once(self, work: Callable[[Any], T]) -> T:
        """work(connection). A connection that died while kept open (server restart, idle
        timeout) is reopened and the work tried once more: only for idempotent work."""
        try:
            return work(self.get())
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            self.reset()
            log.warning("database connection lost; reconnecting")
        try:
            return work(self.get())
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            self.reset()
            raise

    def call(self, work: Callable[..., T], *args: Any) -> T:
        """work(cursor, *args) in autocommit (each statement its own transaction) on this thread's
        connection, reopened once if it was dropped (retry_once: idempotent work only). The hot
        loops' statements (newsletter claims and marks, reclaim) use it: no pool check-out each."""

        def on(conn):
            with conn.cursor() as cur:
                return work(cur, *args)

        return self.retry_once(on)

    def run(self, sql: str, params=None, fetch: bool = True):
        """One statement, as call(): rows if it returns any and `fetch`, else the rows it changed."""

        def statement(cur):
            cur.execute(sql, params)
            if fetch and cur.description:
                return cur.fetchall()
            return cur.rowcount

        return self.call(statement)


thread_connection = ThreadConnection()


def write_deadline(claimed_at: float, timeout_seconds: float) -> float:
    """Until when a worker keeps retrying a write that can also be left to the watchdog or the
    reclaimer (giving back runs it claimed at `claimed_at`, time.monotonic()): comfortably before they
    may take the rows back after `timeout_seconds` — 30 s before, or a fifth of the timeout."""
    return claimed_at + timeout_seconds - min(30.0, timeout_seconds / 5)


def until_written(work, deadline: float | None, what: str):
    """work() — a write whose outcome must not be lost (mail the provider already accepted) —
    retried while the database is unavailable, with backoff, until `deadline` (time.monotonic());
    with None, for as long as this process lives: the caller holds its rows meanwhile
    (app/platform/holds.py renews their claim), so nobody else sends them. Past a deadline the last
    error is raised."""

    def log_wait(state):
        log.warning(
            "%s: database unavailable (%s); retrying in %.1f s",
            what,
            state.outcome.exception(),
            state.next_action.sleep,
        )

    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    stop = tenacity.stop_never if left is None else tenacity.stop_before_delay(left)
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(UNAVAILABLE),
        stop=stop,
        wait=tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0),
        before_sleep=log_wait,
        reraise=True,
    )
    return retrying(work)


def watched_seconds() -> float:
    """How long the calling thread has seen the database without a break: its kept connection's
    age, and no longer than the server has been up (behind a pooler the client's connection may
    outlive a server restart). The reclaimers wait for this after an outage (app/platform/holds.py)."""
    ((up,),) = thread_connection.run("SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8")
    return min(thread_connection.connected_seconds(), float(up))


def server_warnings() -> list[str]:
    """What in the Postgres server's own settings will hurt the service (the scheduler logs it at
    start). Without autovacuum no event partition is ever analyzed: with no statistics the planner
    takes `id = ANY(...)` to match 1/200 of a table, and each digest's details lookup became a
    sequential scan once the events reached millions (docs/operations.md "Postgres settings")."""
    ((autovacuum,),) = query("SHOW autovacuum")
    if autovacuum == "on":
        return []
    return [
        "autovacuum is off on this Postgres server: event tables go unanalyzed and digest lookups "
        "degrade to sequential scans as they grow; turn it on (docs/operations.md)"
    ]


def database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/") or "postgres"


ALL_TABLES = [
    "api_keys",
    "subscribers",
    "digest_runs",
    "digest_events",
    "newsletters",
    "email_log",
    "email_links",
    "email_link_history",
    "legacy_link_codes",
    "webhook_events",
    "suppressions",
    "mail_event_counts",
    "leases",
    "admin_sessions",
    "admin_audit",
    "categories",
    "digest_event_keys",
    "webhook_event_keys",
    "retention_drops",
    "digest_send_now",
    "mail_stop",
    "feed_state",
    "feed_entities",
    "feed_state_all",
    "digest_marks",
    "mail_budget",
]


def pg_array(values) -> str:
    """'{1,2,3}' for a ::bigint[] (or ::int[]) parameter. psycopg2 would send ARRAY[1,2,3], which
    Postgres parses element by element: for the ~1000 event ids of a batch that doubled the
    statement's cost."""
    return "{" + ",".join(map(str, values)) + "}"


def pg_text_array(values) -> str:
    """The same for a ::text[] parameter (or any type read from text, ::pg_snapshot[]); None is NULL.
    Every element is double-quoted with its backslashes and double quotes escaped, so any string
    arrives as it was (tests/platform/test_db_arrays.py). The link rows' statement with 300 URLs so
    cost Postgres 2.9 ms against 3.5 with psycopg2's ARRAY['…', …] (the statement alone in a loop)."""
    return "{" + ",".join("NULL" if v is None else '"' + _array_quoted(v) + '"' for v in values) + "}"


def _array_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
