"""Which of a subscriber's events a digest has handled, recorded without rewriting event rows.

Every event row carries the transaction that inserted it (digest_events.txid, migration 0690). A
digest reads its subscriber's events as of one snapshot; when it is sent (or skipped with its events
handled) that snapshot becomes the subscriber's mark (digest_marks.through, the one owner is this
module): every event visible in it has been handled. The next digest reads the events its mark does
not show — those that committed after it, whatever their ids. So an event committed while a digest
is being built lands in exactly that digest (it was visible when the digest read) or exactly the
next one (it was not), never both and never neither; ids alone cannot say this, because they are
drawn at insert and committed in any order.

Marking a digest is one narrow row updated in place (a HOT update) and two snapshot columns of the
run row it writes anyway, not one rewritten event row (and its index entries) per event.

Runs that handle only part of what the mark would cover mark their events one by one, as before
(digest_events.digest_run_id): a "send now" run of a digest subscriber (only the events that cannot
wait) and a run that read DIGEST_MAX_EVENTS (the rest waits). An event with digest_run_id set is
handled whatever the mark says.

Runs of one subscriber never build at the same time (digest/claim.py), so each reads the mark its
predecessor committed. A run the watchdog handed to a second worker may record twice; the mark only
moves forward (digest_snapshot_newer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.platform import db
from app.platform.db import pg_array, pg_text_array

log = logging.getLogger("digest.marks")

# The SQL definition of "not handled yet" for an event row `e` and its subscriber's mark `m`
# (a pg_snapshot expression, NULL when there is none). The txid range is the index condition
# (digest_events_pending_idx: user_id, txid, id WHERE digest_run_id IS NULL); events of
# transactions that were still running in the mark lie above its xmin.
_PENDING = (
    "{e}.digest_run_id IS NULL AND {e}.txid >= coalesce(pg_snapshot_xmin({m}), '0'::xid8) "
    "AND ({m} IS NULL OR NOT pg_visible_in_snapshot({e}.txid, {m}))"
)


def pending(event: str = "e", mark: str = "m.through") -> str:
    """The SQL condition: event row `event` was not handled by any digest of the subscriber whose mark
    is `mark`. Every statement that asks "what is left to send" uses it."""
    return _PENDING.format(e=event, m=mark)


# The subscriber's mark joined by subscriber row `s` (LEFT JOIN: no mark yet = nothing handled).
JOIN_MARK = "LEFT JOIN digest_marks m ON m.subscriber_id = s.id"


@dataclass(frozen=True)
class Cover:
    """What a run handles when it records: the events visible in `through` and not in `after`."""

    after: str | None  # the subscriber's mark when the events were read (None: none yet)
    through: str  # the snapshot they were read as of


_READ_SQL = """
SELECT pg_current_snapshot()::text,
       coalesce(array_agg(m.subscriber_id), '{}'), coalesce(array_agg(m.through::text), '{}')
FROM digest_marks m WHERE m.subscriber_id = ANY (%s::bigint[])
"""


def read(cur, subscriber_ids: list[int]) -> tuple[str, dict[int, str]]:
    """(a snapshot taken now, {subscriber_id: their mark}) in one statement. Reading as of that
    snapshot (digest/load.py filters by it) makes the events read exactly those a mark can cover:
    a later statement's own snapshot may show more."""
    cur.execute(_READ_SQL, (pg_array(sorted(set(subscriber_ids))),))
    snapshot, ids, marks = cur.fetchone()
    return snapshot, dict(zip(ids, marks))


_ADVANCE_SQL = """
INSERT INTO digest_marks AS m (subscriber_id, through)
SELECT * FROM unnest(%s::bigint[], %s::pg_snapshot[])
ON CONFLICT (subscriber_id) DO UPDATE SET through = EXCLUDED.through, updated_at = now()
WHERE digest_snapshot_newer(EXCLUDED.through, m.through)
"""


def advance(cur, covers: list[tuple[int, Cover]]) -> None:
    """[(subscriber_id, cover)] of runs recorded as handled, in the caller's transaction: each
    subscriber's mark moves to the cover's snapshot (never back)."""
    latest: dict[int, str] = {}
    for sid, cover in covers:
        latest[sid] = cover.through  # one load statement per batch: a subscriber's covers are equal
    if latest:
        sids = sorted(latest)  # rows locked in one order: two batches cannot deadlock
        cur.execute(_ADVANCE_SQL, (pg_array(sids), pg_text_array([latest[s] for s in sids])))


# The events a run handled: marked one by one, or in its cover (the run row's snapshots).
_RUN_EVENTS = """
SELECT {columns} FROM digest_events e WHERE e.digest_run_id = %(run)s
UNION ALL
SELECT {columns}
FROM digest_runs r JOIN subscribers s ON s.id = r.subscriber_id
JOIN digest_events e ON e.user_id = s.user_id
WHERE r.id = %(run)s AND r.events_through IS NOT NULL
  AND {pending} AND pg_visible_in_snapshot(e.txid, r.events_through)
"""


def run_events_sql(columns: str) -> str:
    """SQL (parameter `run`): `columns` of every event run `run` handled."""
    return _RUN_EVENTS.format(columns=columns, pending=pending("e", "r.events_after"))


def handled_by(event_ids) -> dict[int, int | None]:
    """{event id: the run that handled it, None while none has}: for audits, drills and tests (a
    scan of the subscriber's runs per event, not a hot path)."""
    rows = db.query(COVERING_RUNS.format(where="e.id = ANY (%s::bigint[])"), (pg_array(sorted(set(event_ids))),))
    return {eid: (runs[0] if runs else None) for eid, runs in rows}


# Every run whose record covers each event: one by one, or by its snapshots. Exactly one per
# handled event is the invariant (tests/digest/test_marks.py, scripts/drill.py check it); `{where}`
# filters the events (alias e).
COVERING_RUNS = """
SELECT e.id, array_remove(ARRAY[e.digest_run_id] || array_agg(DISTINCT r.id), NULL)
FROM digest_events e
LEFT JOIN subscribers s ON s.user_id = e.user_id
LEFT JOIN digest_runs r ON r.subscriber_id = s.id AND r.events_through IS NOT NULL AND e.digest_run_id IS NULL
     AND pg_visible_in_snapshot(e.txid, r.events_through)
     AND (r.events_after IS NULL OR NOT pg_visible_in_snapshot(e.txid, r.events_after))
WHERE {where}
GROUP BY e.id, e.digest_run_id
"""
