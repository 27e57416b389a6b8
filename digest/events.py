"""The one owner of `digest_events`: every statement that writes it.

Rows come in through the ingest writer (digest/ingest.py builds them and commits groups of them with
INSERT_SQL), are marked handled one by one for the runs that cannot use a snapshot mark
(`mark_handled`, digest/marks.py says which), are deleted with their subscriber (`erase`), and got a
txid in migration 0691 (`backfill_txid`). Partitions come and go with app/platform/partitions.py and
retention.py.
"""

from __future__ import annotations

import logging

from app.platform import db, migrate
from app.platform.db import pg_array

log = logging.getLogger("digest.events")

# A row whose (source, producer_id) is taken is skipped by the table's trigger (the key lives in
# digest_event_keys, migration 0520), so RETURNING lists the stored rows only. No ON CONFLICT: on
# the partitioned table it would cost a speculative insertion per row and could never fire.
INSERT_SQL = (
    "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
    "actor_id, actor_name, payload, occurred_at) VALUES %s "
    "RETURNING source, producer_id"
)
INSERT_TEMPLATE = "(%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, COALESCE(%s::timestamptz, now()))"
# high_priority and critical are named only when a row of the group is urgent: the usual statement
# stays as it was.
INSERT_HIGH_SQL = INSERT_SQL.replace("occurred_at)", "occurred_at, high_priority, critical)")
INSERT_HIGH_TEMPLATE = INSERT_TEMPLATE[:-1] + ", %s, %s)"

# `digest_run_id IS NULL`: an event is never claimed by two sent digests. In id order, the update
# walks the heap and indexes in order instead of jumping around.
_MARK_HANDLED = """
UPDATE digest_events e SET digest_run_id = v.run_id
FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, run_id)
WHERE e.id = v.id AND e.digest_run_id IS NULL
"""


def mark_handled(cur: db.Cursor, pairs: list[tuple[int, int]]) -> None:
    """Record (event id, run id) pairs: each event handled by that run, unless another run has it."""
    if pairs:
        event_ids, run_ids = zip(*sorted(pairs))
        cur.execute(_MARK_HANDLED, (pg_array(event_ids), pg_array(run_ids)))


def erase(cur: db.Cursor, user_id: str) -> None:
    """Every event of this user (right to erasure), whether or not they are a subscriber."""
    cur.execute("DELETE FROM digest_events WHERE user_id = %s", (user_id,))


# -- migration 0691 -----------------------------------------------------------------------------
_BACKFILL_BATCH = 5000
_BACKFILL_SQL = f"""
WITH batch AS (
    SELECT id, received_at FROM digest_events
    WHERE id > %s AND digest_run_id IS NULL AND txid IS NULL
    ORDER BY id LIMIT {_BACKFILL_BATCH}
), done AS (
    UPDATE digest_events e SET txid = '1' FROM batch
    WHERE e.id = batch.id AND e.received_at = batch.received_at AND e.txid IS NULL
)
SELECT max(id), count(*) FROM batch
"""


def backfill_txid(conn) -> None:
    """Migration 0691 (the runner passes its own connection, autocommit): the unhandled events stored
    before 0690 get txid '1', shown by every snapshot."""
    after, total = 0, 0
    while True:
        last, n = migrate.batch(conn, lambda cur, after=after: _fetch(cur, _BACKFILL_SQL, (after,)), "txid backfill")
        total += n
        if last is None:
            break
        after = last
    log.info("txid backfill: %d unhandled events", total)


def _fetch(cur, sql, params):
    cur.execute(sql, params)
    return cur.fetchone()
