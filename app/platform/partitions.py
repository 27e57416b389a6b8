"""The monthly partitions of the event tables: which tables, their partitions, and adding them ahead.

digest_events and webhook_events are partitioned by month on received_at, email_link_history on
occurred_at (converted online by migrations 0520-0525; README "Retention"). A row goes to the
partition of its month, so a month must exist before its first row arrives: the scheduler adds
AHEAD_MONTHS months ahead on every tick (a no-op almost always), and so does every `migrate`, so a
deploy after a long scheduler outage repairs it too. Should every partition ahead be used up all
the same, inserts of that table fail (the API answers 503, nothing is half-written) until one is
added.

The bounds and names (UTC months, `<table>_pYYYY_MM`) are defined once, in the SQL functions
time_partitions() and create_time_partitions() of migration 0521; this module calls them. A new
partition is created alone and then attached, which takes SHARE UPDATE EXCLUSIVE on the parent:
no read or write waits for it. Its statements run under MIGRATION_LOCK_TIMEOUT; a lock not
granted is retried on the next tick.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import psycopg2.errors
from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor

from app.platform import config, db

log = logging.getLogger("app.platform.partitions")

AHEAD_MONTHS = 3


@dataclass(frozen=True)
class Table:
    name: str
    key: str  # the partition key column
    keys_table: str | None = None  # its dedup keys (migration 0520), pruned by retention
    key_columns: tuple[str, ...] = ()
    never_used: str | None = None  # SQL: a row retention counts as dropped without ever being used
    # SQL function (partition regclass, after id, up to id) retention calls for each pruned chunk of a
    # detached partition: what the database derives from the rows (a summary) is recomputed without them.
    derived_refresh: str | None = None


TABLES = (
    Table(
        "digest_events",
        "received_at",
        "digest_event_keys",
        ("source", "producer_id"),
        never_used="NOT digest_event_handled(user_id, txid, digest_run_id)",  # no digest handled it (0690)
        derived_refresh="feed_entities_refresh_range",  # the in-app feed's summary (migration 0680)
    ),
    Table(
        "webhook_events", "received_at", "webhook_event_keys", ("sg_event_id",), never_used="processed_at IS NULL"
    ),  # never applied
    Table("email_link_history", "occurred_at"),
)
BY_NAME = {t.name: t for t in TABLES}


@dataclass(frozen=True)
class Partition:
    name: str
    range_from: datetime | None  # None: MINVALUE (the table as it was before partitioning)
    range_to: datetime
    detach_pending: bool


def lock_not_granted(logger: logging.Logger, work: str, table: Table) -> None:
    """Logs `work` on `table` skipped: a lock was not granted within MIGRATION_LOCK_TIMEOUT."""
    logger.warning(
        "%s of %s: lock not granted within %s; the next tick tries again",
        work,
        table.name,
        config.get().migration_lock_timeout,
    )


def is_partitioned(cur: Cursor, table: str) -> bool:
    cur.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", (table,))
    row = cur.fetchone()
    return bool(row and row[0])


def list_partitions(cur: Cursor, table: str) -> list[Partition]:
    """Oldest first, including one whose DETACH CONCURRENTLY was interrupted (detach_pending)."""
    cur.execute("SELECT partition::text, range_from, range_to, detach_pending FROM time_partitions(%s)", (table,))
    return [Partition(*row) for row in cur.fetchall()]


def ensure_ahead(conn: Connection, now: datetime | None = None, months: int = AHEAD_MONTHS) -> list[str]:
    """Add the missing partitions up to `months` months after the month of `now` (default: the
    database's clock), one transaction per table. Returns the names created. `conn` is autocommit."""
    created = []
    for table in TABLES:
        try:
            with db.transaction(conn) as cur:
                if not is_partitioned(cur, table.name):
                    continue
                cur.execute("SET LOCAL lock_timeout = %s", (config.get().migration_lock_timeout,))
                cur.execute("SELECT create_time_partitions(%s, coalesce(%s, now()), %s)", (table.name, now, months))
                names = [row[0] for row in cur.fetchall()]
        except psycopg2.errors.LockNotAvailable:
            lock_not_granted(log, "partitions", table)
            continue
        if names:
            log.info("created partitions %s", ", ".join(names))
        created += names
    return created
