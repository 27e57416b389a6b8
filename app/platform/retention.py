"""Retention: a monthly partition of an event table goes whole once its newest row is older than
RETENTION_DAYS — dropped, never DELETEd row by row.

digest_events: a partition goes with its included events and with the events never included in a
digest (nobody subscribed to that user_id, every topic opted out, ...); those are counted first,
logged and exported (notify_retention_never_used_total{table="digest_events"}). webhook_events:
the same, counting events never applied. email_link_history: clicks and opens go with their month.

Each drop is a small state machine in `retention_drops` (one row per partition; this module owns
every write to it), so a scheduler killed at any point resumes where it stopped:

  (new) --partition entirely older than the cutoff--> detaching
  detaching --DETACH PARTITION ... CONCURRENTLY; never-used rows counted, logged, exported--> pruning
  pruning --its dedup keys deleted and what derives from its rows recomputed (the feed summary,
            Table.derived_refresh), PRUNE_CHUNK rows per transaction--> (same, keys_pruned_to moves)
  pruning --all keys gone; DROP TABLE; parent re-ANALYZEd--> dropped

DETACH CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on the parent: ingestion and digests go on while
it waits for the queries that still see the partition. One that is interrupted (lock_timeout, a
kill) leaves the partition "detach pending", and the next tick FINALIZEs it. Once detached, no
query can include its events any more, so the count is exact. The dedup keys of its rows are then
deleted in chunks; meanwhile a re-sent key of an expired event is still refused as a duplicate.
DROP TABLE of a partition with a foreign key briefly takes ACCESS EXCLUSIVE on the referenced
table (digest_runs, email_links): MIGRATION_LOCK_TIMEOUT bounds it, and a lock not granted is
retried on the next tick. A tick spends at most WORK_SECONDS here; a large partition's keys take
several ticks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime

import psycopg2.errors
from psycopg2 import sql

from app.platform import config, db, metrics, migrate, partitions

log = logging.getLogger("app.platform.retention")

WORK_SECONDS = 5.0  # of each scheduler tick, at most
PRUNE_CHUNK = 20_000  # dedup keys deleted per transaction


@dataclass
class Drop:
    id: int
    partition: str
    state: str
    keys_pruned_to: int


def maintain(now: datetime | None = None, url: str | None = None) -> dict:
    """The scheduler's job, every tick: partitions ahead, then retention. `now` defaults to the
    database's clock. Its own connection, to where migrations run (MIGRATION_DATABASE_URL, else
    DATABASE_URL): DETACH ... CONCURRENTLY cannot run in a transaction block, so its lock_timeout is
    a session setting, which must never reach a pool or a transaction-pooling PgBouncer."""
    with contextlib.closing(db.connect_raw(migrate.target_url(url), autocommit=True)) as conn:
        created = []
        try:
            created = partitions.ensure_ahead(conn, now)
        except Exception:
            log.exception("adding partitions ahead failed; the next tick tries again")
        return {"created": created, **run(conn, now)}


def run(conn, now: datetime | None = None, budget_seconds: float = WORK_SECONDS) -> dict:
    """Advance the due drops as far as the budget allows, and each table's oldest by at least one
    step whatever the budget. Returns the partitions dropped and how many drops are under way."""
    days = config.get().retention_days
    if days <= 0:
        return {"dropped": [], "unfinished": 0}
    deadline = time.monotonic() + budget_seconds
    with db.transaction(conn) as cur:
        cur.execute("SELECT coalesce(%s, now()) - make_interval(days => %s)", (now, days))
        cutoff = cur.fetchone()[0]
    dropped, unfinished = [], 0
    for table in partitions.TABLES:
        try:
            done, left = _retire(conn, table, cutoff, deadline)
        except psycopg2.errors.LockNotAvailable:
            partitions.lock_not_granted(log, "retention", table)
            continue
        dropped += done
        unfinished += left
    return {"dropped": dropped, "unfinished": unfinished}


def _retire(conn, table: partitions.Table, cutoff: datetime, deadline: float) -> tuple[list[str], int]:
    with db.transaction(conn) as cur:
        if not partitions.is_partitioned(cur, table.name):
            return [], 0
        for p in partitions.list_partitions(cur, table.name):
            if p.range_to <= cutoff:
                cur.execute(
                    "INSERT INTO retention_drops (parent, partition, range_to) VALUES (%s, %s, %s) "
                    "ON CONFLICT (partition) DO NOTHING",
                    (table.name, p.name, p.range_to),
                )
        cur.execute(
            "SELECT id, partition, state, keys_pruned_to FROM retention_drops "
            "WHERE parent = %s AND state <> 'dropped' ORDER BY range_to",
            (table.name,),
        )
        drops = [Drop(*row) for row in cur.fetchall()]
    dropped = []
    for drop in drops:
        if drop.state == "detaching":
            _detach(conn, table, drop)
        if drop.state == "pruning" and _prune_keys(conn, table, drop, deadline):
            _drop(conn, table, drop)
        if drop.state == "dropped":
            dropped.append(drop.partition)
        if time.monotonic() >= deadline:
            break
    if dropped:
        _analyze(conn, table)
    return dropped, len(drops) - len(dropped)


def _attached(cur, table: partitions.Table, name: str) -> partitions.Partition | None:
    return next((p for p in partitions.list_partitions(cur, table.name) if p.name == name), None)


def _detach(conn, table: partitions.Table, drop: Drop) -> None:
    with conn.cursor() as cur:
        attached = _attached(cur, table, drop.partition)
        if attached is not None:
            how = "FINALIZE" if attached.detach_pending else "CONCURRENTLY"
            cur.execute("SET lock_timeout = %s", (config.get().migration_lock_timeout,))
            try:
                cur.execute(
                    sql.SQL("ALTER TABLE {} DETACH PARTITION {} " + how).format(
                        sql.Identifier(table.name), sql.Identifier(drop.partition)
                    )
                )
            finally:
                cur.execute("RESET lock_timeout")
    with db.transaction(conn) as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (drop.partition,))
        exists = cur.fetchone()[0]
        never_used = rows = None
        if exists:
            cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", (drop.partition,))
            rows = cur.fetchone()[0]
            if rows < 0:  # never analyzed, so small: count it
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(drop.partition)))
                rows = cur.fetchone()[0]
            if table.never_used:
                cur.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE " + table.never_used).format(sql.Identifier(drop.partition))
                )
                never_used = cur.fetchone()[0]
        # A partition that is gone already (dropped by hand) has nothing left to count or prune.
        drop.state = "pruning" if exists else "dropped"
        cur.execute(
            "UPDATE retention_drops SET state = %s, rows_estimate = %s, never_used = %s, "
            "dropped_at = CASE WHEN %s = 'dropped' THEN now() END "
            "WHERE id = %s AND state = 'detaching' RETURNING 1",
            (drop.state, rows, never_used, drop.state, drop.id),
        )
        counted = cur.fetchone() is not None
    if counted and never_used is not None:
        what = "included in a digest" if table.name == "digest_events" else "applied"
        log.info(
            "retention: %s detached (about %d rows older than %d days); %d of them were never %s",
            drop.partition,
            rows,
            config.get().retention_days,
            never_used,
            what,
        )
        metrics.retention_never_used(table.name, never_used)


def _prune_keys(conn, table: partitions.Table, drop: Drop, deadline: float) -> bool:
    """Delete the dedup keys of the detached partition's rows, in id order, one chunk per
    transaction, at least one chunk, and recompute what is derived from the chunk's rows
    (Table.derived_refresh). True once none is left."""
    if table.keys_table is None:
        return True
    match = sql.SQL(" AND ").join(sql.SQL("k.{0} = c.{0}").format(sql.Identifier(c)) for c in table.key_columns)
    prune = sql.SQL(
        "WITH chunk AS (SELECT id, {cols} FROM {part} WHERE id > %s ORDER BY id LIMIT %s), "
        "gone AS (DELETE FROM {keys} k USING chunk c WHERE {match} AND k.event_id = c.id) "
        "SELECT max(id), count(*) FROM chunk"
    ).format(
        cols=sql.SQL(", ").join(map(sql.Identifier, table.key_columns)),
        part=sql.Identifier(drop.partition),
        keys=sql.Identifier(table.keys_table),
        match=match,
    )
    while True:
        with db.transaction(conn) as cur:
            cur.execute(prune, (drop.keys_pruned_to, PRUNE_CHUNK))
            last, n = cur.fetchone()
            if n:
                if table.derived_refresh:
                    cur.execute(
                        sql.SQL("SELECT {}(%s::regclass, %s, %s)").format(sql.Identifier(table.derived_refresh)),
                        (drop.partition, drop.keys_pruned_to, last),
                    )
                cur.execute("UPDATE retention_drops SET keys_pruned_to = %s WHERE id = %s", (last, drop.id))
        if n:
            drop.keys_pruned_to = last
        if n < PRUNE_CHUNK:
            return True
        if time.monotonic() >= deadline:
            return False


def _drop(conn, table: partitions.Table, drop: Drop) -> None:
    with db.transaction(conn) as cur:
        if _attached(cur, table, drop.partition) is not None:  # never drop a partition still in use
            raise RuntimeError(f"{drop.partition} is still attached to {table.name}; not dropping it")
        cur.execute("SET LOCAL lock_timeout = %s", (config.get().migration_lock_timeout,))
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(drop.partition)))
        cur.execute(
            "UPDATE retention_drops SET state = 'dropped', dropped_at = now() WHERE id = %s RETURNING rows_estimate",
            (drop.id,),
        )
        rows = cur.fetchone()[0]
    drop.state = "dropped"
    log.info("retention: dropped %s (about %d rows)", drop.partition, rows or 0)
    metrics.retention_dropped(table.name)


def _analyze(conn, table: partitions.Table) -> None:
    """Autovacuum never analyzes a partitioned parent; its statistics just lost a month."""
    with conn.cursor() as cur:
        cur.execute("SET lock_timeout = %s", (config.get().migration_lock_timeout,))
        try:
            cur.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table.name)))
        except psycopg2.errors.LockNotAvailable:
            log.info("ANALYZE %s skipped: another maintenance command holds it", table.name)
        finally:
            cur.execute("RESET lock_timeout")
