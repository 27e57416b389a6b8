"""Plain-SQL migration runner: sql/migrations/NNNN_name.sql applied in order, recorded with duration.

A file whose first lines contain `-- migrate: no-transaction` runs statement by statement in
autocommit (needed for CREATE INDEX CONCURRENTLY). One with `-- migrate: python module:function`
runs the same way, then calls that function with the migrator's connection (autocommit), for data
changes SQL cannot compute (the function commits its own batches and must be safe to run again:
a failure leaves the file pending). Every statement runs under a short lock_timeout
and is retried when the lock is not granted, so a migration never queues behind a long query while
blocking every writer behind itself. An INVALID index left by a failed concurrent build is dropped
and built again. CREATE INDEX CONCURRENTLY on a partitioned table, which Postgres refuses, is built
partition by partition (app/platform/partitioned_index.py).

Kept over yoyo-migrations (it reads these files with `-- transactional: false` added to the four
no-transaction ones) for what an operator meets, not for speed (`scripts/bench/migrations.py`
compares both; BENCHMARKS.md, "migration runner"). A migrator killed while waiting (deploy timeout)
leaves yoyo's lock row behind, so the next release fails until `yoyo break-lock`; ours reruns at
once (the advisory lock ends with the connection; MIGRATION_DATABASE_URL keeps it on a direct
connection when the application goes through PgBouncer). A failed CREATE UNIQUE INDEX
CONCURRENTLY stays INVALID under yoyo and is recorded applied (unique not enforced); rebuilt here.
Behind a long transaction a writer stalls for all of it under yoyo (no retry: a lock_timeout in its
URL fails the release) and for one MIGRATION_LOCK_TIMEOUT at most here, hence its short default
(at 5s it stalled 5 s per attempt, 9.6 s of the 10 blocked).
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import psycopg2.errors
import sqlparse

from app.platform import config, db, partitioned_index, partitions

log = logging.getLogger("app.platform.migrate")

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "sql" / "migrations"
FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
NO_TX_MARK = re.compile(r"^--\s*migrate:\s*no-transaction\s*$", re.MULTILINE | re.IGNORECASE)
PYTHON_STEP_MARK = re.compile(r"^--\s*migrate:\s*python\s+(?P<target>[\w.]+:\w+)\s*$", re.MULTILINE | re.IGNORECASE)
CONCURRENT_INDEX_RE = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>[a-zA-Z0-9_\"]+)",
    re.IGNORECASE,
)
ADVISORY_LOCK_KEY = 0x6E6F7469  # one migrator at a time, whatever the number of release processes

TRACKING_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     text PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    duration_ms integer NOT NULL
)"""


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text()

    @property
    def _head(self) -> str:
        return "\n".join(self.sql.splitlines()[:5])

    @property
    def transactional(self) -> bool:
        return not NO_TX_MARK.search(self._head) and self.python_step is None

    @property
    def python_step(self) -> str | None:
        found = PYTHON_STEP_MARK.search(self._head)
        return found.group("target") if found else None


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = FILE_RE.match(path.name)
        if not m:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        found.append(Migration(m.group(1), m.group(2), path))
    versions = [m.version for m in found]
    dupes = {v for v in versions if versions.count(v) > 1}
    if dupes:
        raise MigrationError(f"two migrations share a version number: {sorted(dupes)}")
    return found


def ensure_database(url: str) -> bool:
    """Create the target database if it is missing (dev and test convenience). True if created."""
    name = db.database_name(url)
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    try:
        db.connect_raw(url).close()
        return False
    except psycopg2.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    conn = db.connect_raw(admin_url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        log.info("created database %s", name)
        return True
    except psycopg2.errors.DuplicateDatabase:
        return False
    finally:
        conn.close()


def applied_versions(conn) -> dict[str, tuple]:
    with conn.cursor() as cur:
        cur.execute(TRACKING_TABLE)
        cur.execute("SELECT version, name, applied_at, duration_ms FROM schema_migrations ORDER BY version")
        return {row[0]: row for row in cur.fetchall()}


def target_url(url: str | None = None) -> str:
    """Where migrations run: `url`, else MIGRATION_DATABASE_URL, else DATABASE_URL. The migrator's
    session matters (see migrate()), so behind a transaction-pooling PgBouncer it needs a direct URL."""
    settings = config.get()
    return url or settings.migration_database_url or settings.database_url


def status(url: str | None = None) -> list[dict]:
    conn = db.connect_raw(target_url(url), autocommit=True)
    try:
        done = applied_versions(conn)
        rows = []
        for m in discover():
            row = done.get(m.version)
            rows.append(
                {
                    "version": m.version,
                    "name": m.name,
                    "state": "applied" if row else "pending",
                    "applied_at": row[2].isoformat() if row else None,
                    "duration_ms": row[3] if row else None,
                }
            )
        return rows
    finally:
        conn.close()


def invalid_indexes(conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT i.indisvalid AND n.nspname = current_schema()"
        )
        return [r[0] for r in cur.fetchall()]


def _drop_invalid_index(conn, statement: str) -> None:
    """Before CREATE INDEX CONCURRENTLY, a leftover INVALID index of that name is rebuilt."""
    m = CONCURRENT_INDEX_RE.search(statement)
    if not m:
        return
    name = m.group("name").strip('"')
    if name in invalid_indexes(conn):
        log.warning("index %s is INVALID (a concurrent build failed earlier): dropping and rebuilding", name)
        _with_lock_retry(conn, f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


def _with_lock_retry(conn, statement: str) -> None:
    settings = config.get()
    for attempt in range(1, settings.migration_retries + 1):
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
            return
        except psycopg2.errors.LockNotAvailable:
            if not conn.autocommit:
                raise
            delay = min(0.2 * 2**attempt, 10.0)
            log.warning(
                "lock not granted within %s (attempt %d), retrying in %.1fs",
                settings.migration_lock_timeout,
                attempt,
                delay,
            )
            time.sleep(delay)
            _drop_invalid_index(conn, statement)  # a concurrent build that timed out left it INVALID
    raise MigrationError(f"gave up after {settings.migration_retries} lock timeouts: {statement[:80]}")


def _apply_transactional(conn, m: Migration, pid: int) -> None:
    settings = config.get()
    for attempt in range(1, settings.migration_retries + 1):
        conn.autocommit = False
        try:
            _same_session(conn, pid)  # inside the migration's own transaction
            with conn.cursor() as cur:
                cur.execute("SET LOCAL lock_timeout = %s", (settings.migration_lock_timeout,))
                cur.execute(m.sql)
            return
        except psycopg2.errors.LockNotAvailable:
            conn.rollback()
            delay = min(0.2 * 2**attempt, 10.0)
            log.warning(
                "%s: lock not granted within %s (attempt %d), retrying in %.1fs",
                m.path.name,
                settings.migration_lock_timeout,
                attempt,
                delay,
            )
            time.sleep(delay)
        except Exception:
            conn.rollback()
            raise
    raise MigrationError(f"{m.path.name}: gave up after {settings.migration_retries} lock timeouts")


def _apply_autocommit(conn, m: Migration, pid: int) -> None:
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SET lock_timeout = %s", (config.get().migration_lock_timeout,))
    for statement in sqlparse.split(m.sql):
        body = sqlparse.format(statement, strip_comments=True).strip().rstrip(";").strip()
        if not body:
            continue
        for step in partitioned_index.steps(conn, body):  # the statement, unless an index on a partitioned table
            _same_session(conn, pid)
            _drop_invalid_index(conn, step)
            _with_lock_retry(conn, step)
    with conn.cursor() as cur:
        cur.execute("RESET lock_timeout")


def batch(conn, work, what: str, retry_on: tuple[type[Exception], ...] = ()):
    """work(cur) in one transaction under MIGRATION_LOCK_TIMEOUT, retried with backoff when a lock
    (a row a request holds) is not granted in time, or on one of `retry_on`: one step of a
    `-- migrate: python` backfill, which commits batch by batch so no lock is held across them."""
    settings = config.get()
    for attempt in range(1, settings.migration_retries + 1):
        try:
            with db.transaction(conn) as cur:
                cur.execute("SET LOCAL lock_timeout = %s", (settings.migration_lock_timeout,))
                return work(cur)
        except (db.LockNotAvailable, *retry_on) as exc:
            delay = min(0.2 * 2**attempt, 10.0)
            log.warning("%s batch: %s (attempt %d), retrying in %.1fs", what, exc.__class__.__name__, attempt, delay)
            time.sleep(delay)
    raise RuntimeError(f"{what}: gave up after {settings.migration_retries} attempts")


def _run_python_step(conn, m: Migration, pid: int) -> None:
    module, _, function = (m.python_step or "").partition(":")
    _same_session(conn, pid)
    conn.autocommit = True
    getattr(importlib.import_module(module), function)(conn)


def _take_migrator_lock(conn) -> int:
    """Poll rather than block: a backend blocked in pg_advisory_lock is an open transaction, and
    CREATE INDEX CONCURRENTLY in the lock holder would wait for it forever (deadlock). Returns this
    session's backend pid (the lock is that backend's)."""
    waiting_since = time.monotonic()
    reported = 0.0
    while True:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (ADVISORY_LOCK_KEY,))
            taken, pid = cur.fetchone()
            if taken:
                return pid
            waited = time.monotonic() - waiting_since
            if waited - reported >= 10:
                reported = waited
                cur.execute(
                    "SELECT array_agg(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND classid = %s AND objid = %s AND objsubid = 1",  # a bigint key: high, low half
                    (ADVISORY_LOCK_KEY >> 32, ADVISORY_LOCK_KEY & 0xFFFFFFFF),
                )
                log.warning(
                    "waiting %.0f s for another migrator (backend %s holds the migration lock)",
                    waited,
                    cur.fetchone()[0],
                )
        time.sleep(0.1)


def _same_session(conn, pid: int) -> None:
    """The migrator's lock and lock_timeout live in one server session. Behind a transaction-pooling
    PgBouncer consecutive transactions may run in different ones: refuse to go on (best effort: it
    catches the change whenever it happens at a checked point)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        now = cur.fetchone()[0]
    if now != pid:
        raise MigrationError(
            f"the migrator's server session changed (backend {pid}, then {now}): the connection goes "
            "through a transaction-pooling proxy such as PgBouncer. Set MIGRATION_DATABASE_URL to "
            "Postgres itself (or a session-mode pool) and run the migration again."
        )


def migrate(url: str | None = None, create_db: bool = True) -> list[str]:
    """Apply every pending migration; returns the versions applied. Safe to run concurrently.

    Runs on one owned session (MIGRATION_DATABASE_URL, else DATABASE_URL) because it holds session
    state across transactions: the advisory lock that serialises migrators, and a session
    lock_timeout for no-transaction files (CREATE INDEX CONCURRENTLY cannot run inside a
    transaction, so SET LOCAL cannot reach it). Through a transaction-pooling PgBouncer both would
    land on whichever server connection each statement got — hence a direct URL there."""
    url = target_url(url)
    if create_db:
        ensure_database(url)
    conn = db.connect_raw(url, autocommit=True)  # owned, not pooled: the advisory lock is this session's
    applied = []
    try:
        pid = _take_migrator_lock(conn)
        try:
            done = applied_versions(conn)
            for m in discover():
                if m.version in done:
                    continue
                started = time.monotonic()
                log.info(
                    "applying %s_%s (%s)", m.version, m.name, "transaction" if m.transactional else "no transaction"
                )
                if m.transactional:
                    _apply_transactional(conn, m, pid)  # leaves the transaction open
                else:
                    _apply_autocommit(conn, m, pid)
                    if m.python_step:
                        _run_python_step(conn, m, pid)
                    conn.autocommit = False
                duration_ms = int((time.monotonic() - started) * 1000)
                with conn.cursor() as cur:
                    cur.execute(
                        "INSERT INTO schema_migrations (version, name, duration_ms) VALUES (%s, %s, %s)",
                        (m.version, m.name, duration_ms),
                    )
                conn.commit()
                conn.autocommit = True
                log.info("applied %s_%s in %d ms", m.version, m.name, duration_ms)
                applied.append(m.version)
            # Every release tops up the monthly partitions too: a deploy after a long scheduler
            # outage must not leave the event tables without a partition for this month.
            partitions.ensure_ahead(conn)
            leftovers = invalid_indexes(conn)
            if leftovers:
                log.warning("INVALID indexes present (not created by a pending migration): %s", leftovers)
        finally:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("RESET lock_timeout")  # if a no-transaction file stopped half-way
                cur.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    finally:
        conn.close()
    return applied
