"""Stored addresses in their canonical form (app/platform/addresses.py `canonical`): the backfill of
migrations 0600-0602 and `python -m app rekey-addresses`.

The canonical form needs Python (the `idna` package: UTS 46 tables Postgres does not have), so
the migration runner calls `backfill` for migration 0601 (app/platform/migrate.py, `-- migrate: python`).
Every pass reads rows in id order and writes, in its own short transaction per batch, only the
rows whose stored key differs from the computed one; so it is also the repair for rows a previous
release's processes wrote while a deploy was under way, and running it again changes nothing.

  subscribers.canonical_email   set where it differs (guarded by the email read: a writer that
                                changed the address meanwhile set the key itself)
  suppressions.email            rewritten to the canonical form; two rows that become one merge:
                                the earliest (created_at, then id) is kept, with its reason, except
                                that 'erased' wins over any reason (an erased address stays erased:
                                its events are deleted on arrival); the merged rows' reasons and
                                sources are appended to the kept row's source
  webhook_events.canonical_email set where it differs (rows without an email keep NULL)
"""

from __future__ import annotations

import functools
import logging

from app.platform import db, migrate
from app.platform.addresses import canonical
from app.subscribers import suppressions

log = logging.getLogger("app.subscribers.rekey")

BATCH = 5000
CONSTRAINT = "subscribers_canonical_email_present"
# A suppression for the canonical form was added meanwhile: the retry sees it and merges into it.
_MERGED = (db.UniqueViolation,)


def _keyed_table(conn, table: str, only_missing: bool = False) -> int:
    """Set `canonical_email` of `table` (subscribers or webhook_events) where it differs; returns
    how many rows changed."""
    missing = " AND canonical_email IS NULL" if only_missing else ""
    read = (
        f"SELECT id, email, canonical_email FROM {table} WHERE id > %s AND email IS NOT NULL{missing} "
        f"ORDER BY id LIMIT {BATCH}"
    )
    write = (
        f"UPDATE {table} t SET canonical_email = v.key FROM (VALUES %s) AS v(id, email, key) "
        "WHERE t.id = v.id AND t.email = v.email AND t.canonical_email IS DISTINCT FROM v.key"
    )

    def one_batch(cur, after: int):
        cur.execute(read, (after,))
        rows = cur.fetchall()
        stale = [(i, email, key) for i, email, stored in rows if (key := canonical(email)) != stored]
        if stale:
            db.execute_values(cur, write, stale, template="(%s::bigint, %s::text, %s::text)", page_size=len(stale))
        return (rows[-1][0] if rows else None), cur.rowcount if stale else 0

    return _in_batches(conn, one_batch)


def _suppressions(conn) -> int:
    def one_batch(cur, after: int):
        cur.execute(f"SELECT id, email FROM suppressions WHERE id > %s ORDER BY id LIMIT {BATCH}", (after,))
        rows = cur.fetchall()
        n = sum(
            suppressions.merge_into_canonical(cur, i, key) for i, email in rows if (key := canonical(email)) != email
        )
        return (rows[-1][0] if rows else None), n

    return _in_batches(conn, one_batch)


def _in_batches(conn, one_batch) -> int:
    """one_batch(cur, after) handles the rows after id `after`, each call in its own transaction, and
    returns (the last id it read or None at the end, rows changed); returns the rows changed in all."""
    after, changed = 0, 0
    while True:
        last, n = migrate.batch(conn, functools.partial(one_batch, after=after), "rekey", _MERGED)
        if last is None:
            return changed
        after, changed = last, changed + n


def _add_constraint(conn) -> None:
    """From now on no subscriber row is without its key (NOT VALID: existing rows are checked by
    0602's VALIDATE, which blocks no writer). A brief ACCESS EXCLUSIVE lock, under the lock timeout."""

    def add(cur):
        cur.execute("SELECT 1 FROM pg_constraint WHERE conname = %s", (CONSTRAINT,))
        if not cur.fetchone():
            cur.execute(
                f"ALTER TABLE subscribers ADD CONSTRAINT {CONSTRAINT} CHECK (canonical_email IS NOT NULL) NOT VALID"
            )

    migrate.batch(conn, add, "rekey", _MERGED)


def rekey(conn) -> dict:
    """Every stored address keyed by its canonical form; returns the rows changed per table."""
    counts = {"subscribers": _keyed_table(conn, "subscribers")}
    _add_constraint(conn)
    # Rows inserted without a key before the constraint existed, behind the pass above.
    counts["subscribers"] += _keyed_table(conn, "subscribers", only_missing=True)
    counts["suppressions"] = _suppressions(conn)
    counts["webhook_events"] = _keyed_table(conn, "webhook_events")
    log.info("rekeyed %s", ", ".join(f"{table}: {n}" for table, n in counts.items()))
    return counts


def backfill(conn) -> None:
    """Migration 0601 (the runner passes its own connection, autocommit)."""
    rekey(conn)
