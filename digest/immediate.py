"""Send-now runs: the `immediately` cadence, and events that cannot wait for a digest.

Who is looked at: `digest_send_now` holds the subscribers who may have something to send now.
Ingest adds a row in the same transaction as the events (digest/ingest.py) when an event is urgent —
`"priority": "high"`, or its category's delivery is `immediate` — or its subscriber chose
`immediately`; the planner adds every `immediately` subscriber once an hour (digest/plan.py), which
picks up events left behind by a pause, a resubscribe or an opt-in. Postgres holds the fact; the
Redis hint sent after the ingest commit (actor send_now) only makes it quicker than the next tick.

What one pass does, in one statement per batch of DIGEST_PLAN_BATCH rows (FOR UPDATE SKIP LOCKED,
so two passes never take the same row):
  * a subscriber who is off, unsubscribed, paused or suppressed, or who has nothing to send now
    (no unsent event they receive: immediately subscribers any, the others only urgent ones, never
    a category they turned off, never their own activity), gets no run;
  * otherwise, unless a send-now run of theirs is already waiting, a run of cadence `immediately`
    is created, due now — or, when IMMEDIATE_MAX_PER_HOUR send-now mails went out in the last
    hour, an hour after the oldest of those (a sliding hour). Events arriving meanwhile wait and go
    in that mail (or in the subscriber's next digest if it comes first): the overflow rolls over;
  * with UNSEEN_GRACE_SECONDS, the run is due that much later, so what the subscriber sees in the
    app meanwhile is left out of it (digest/seen.py), and a run left with nothing is skipped;
  * the row is consumed, except while a send-now run of the subscriber is `processing`: that run
    may have loaded its events before this row's events committed, so the row stays for the pass
    after it; and while the subscriber's row is held FOR UPDATE (an erasure): skipped, not waited
    for (the lock order below).
  * a subscriber with a critical event (`"priority": "critical"`) not yet handled gets a run of
    cadence `critical`, due now whatever the hourly limit or the grace, unless one of theirs is
    already waiting (digest_runs_one_live_critical): it loads only the critical events and passes
    quiet hours and the mail budget at claim (digest/claim.py), so it goes at once in a mail of its
    own. Critical events make no `immediately` run, and a send-now run never loads them.
The runs then take the ordinary way: checker, claim (I6 checks), build, send with
`digest-run-<id>`, mark run and events in one transaction. A daily/weekly/hourly subscriber's
send-now run loads only the urgent events (digest/load.py); the rest waits for their digest, and
an urgent event the digest sent first is simply not there any more.
"""

from __future__ import annotations

import logging
from datetime import datetime

from app.platform import config, db
from app.subscribers import categories, mailable
from app.subscribers.streams import DIGESTS
from digest import marks
from digest import runs as digest_runs

log = logging.getLogger("digest.immediate")

MAX_BATCHES = 20  # per pass; what is left waits for the next tick

_PASS_SQL = f"""
WITH due AS (
    SELECT subscriber_id FROM digest_send_now
    ORDER BY since, subscriber_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), held AS (
    -- The subscribers' rows, KEY SHARE (what the runs' foreign key checks take anyway, but at the
    -- statement's end, after the marks were deleted): taken now and never waited for. One held
    -- FOR UPDATE (an erasure) waits for its digest_send_now row, so its mark stays for a later pass.
    SELECT s.id FROM subscribers s WHERE s.id IN (SELECT subscriber_id FROM due)
    ORDER BY s.id
    FOR KEY SHARE SKIP LOCKED
), subs AS (
    SELECT s.id, s.user_id, s.digest_cadence, s.category_opt_outs, m.through
    FROM held JOIN subscribers s ON s.id = held.id
    {marks.JOIN_MARK}
    WHERE {mailable.may_mail(DIGESTS, "s", "%(now)s")}
), eligible AS (
    SELECT subs.id FROM subs
    WHERE EXISTS (SELECT 1 FROM digest_events e
                  WHERE e.user_id = subs.user_id AND {marks.pending("e", "subs.through")}
                    AND NOT (e.category = ANY (subs.category_opt_outs))
                    AND e.actor_id IS DISTINCT FROM subs.user_id
                    AND e.critical IS NOT TRUE
                    AND (subs.digest_cadence = 'immediately' OR e.high_priority
                         OR e.category = ANY (%(urgent_categories)s::text[])))
), critical_eligible AS (
    SELECT subs.id FROM subs
    WHERE EXISTS (SELECT 1 FROM digest_events e
                  WHERE e.user_id = subs.user_id AND {marks.pending("e", "subs.through")} AND e.critical
                    AND NOT (e.category = ANY (subs.category_opt_outs))
                    AND e.actor_id IS DISTINCT FROM subs.user_id)
), live AS (
    SELECT r.subscriber_id, r.status, r.cadence FROM digest_runs r
    WHERE r.subscriber_id IN (SELECT id FROM eligible UNION ALL SELECT id FROM critical_eligible)
      AND r.cadence IN ('immediately', 'critical') AND r.status IN ('pending', 'processing')
), critical_fresh AS (
    SELECT c.id FROM critical_eligible c
    WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.subscriber_id = c.id AND live.cadence = 'critical')
), fresh AS (
    -- The rate limit: the newest IMMEDIATE_MAX_PER_HOUR sent send-now runs (a backward scan of the
    -- unique key, which orders them by when they were due); full, the next is allowed an hour
    -- after the oldest of them was sent.
    SELECT eligible.id, greatest(%(now)s::timestamptz + make_interval(secs => %(grace)s), (
               SELECT min(l.completed_at) + interval '1 hour'
               FROM (SELECT p.completed_at FROM digest_runs p
                     WHERE p.subscriber_id = eligible.id AND p.cadence = 'immediately' AND p.status = 'sent'
                     ORDER BY p.period DESC, p.slot DESC
                     LIMIT %(max_per_hour)s) l
               HAVING count(*) >= %(max_per_hour)s)) AS at
    FROM eligible
    WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.subscriber_id = eligible.id AND live.cadence = 'immediately')
), revived AS ({digest_runs.REVIVE_IMMEDIATE}
), inserted AS ({digest_runs.INSERT_IMMEDIATE}
), inserted_critical AS ({digest_runs.INSERT_CRITICAL}
), made AS (
    SELECT id, scheduled_for FROM inserted UNION ALL SELECT id, scheduled_for FROM revived
    UNION ALL SELECT id, scheduled_for FROM inserted_critical
), consumed AS (
    DELETE FROM digest_send_now d USING held
    WHERE d.subscriber_id = held.id
      AND NOT EXISTS (SELECT 1 FROM live WHERE live.subscriber_id = held.id AND live.status = 'processing')
    RETURNING 1
)
SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM consumed),
       ARRAY(SELECT id FROM made WHERE scheduled_for <= %(now)s ORDER BY id),
       (SELECT count(*) FROM made)
"""


# -- digest_send_now: this module is its one writer ------------------------------------------------
# Ingest and planning mark subscribers; a pass (plan below) consumes the marks. DO UPDATE, not DO
# NOTHING: a row a pass holds (FOR UPDATE) may be about to be deleted by it, its snapshot older
# than what the marker saw; updating waits for that pass and then inserts the row again, so the
# next pass looks at it. The subscribers join: only ids that exist (an erasure may have come first).
#
# Lock order (issue 37): a path that may wait takes a subscriber's row before that subscriber's
# digest_send_now row, ids ascending, as the planner's hand-off (digest/plan.py) and an erasure (its
# delete cascades) do; the pass takes both without waiting. Here FOR KEY SHARE: the lock the foreign
# key check takes anyway, but only at the statement's end, after the rows were inserted. A subscriber
# erased meanwhile is skipped instead of failing the statement (and ingest's whole group commit) with
# a foreign key violation.
_MARK_SQL = """
INSERT INTO digest_send_now (subscriber_id)
SELECT id FROM subscribers WHERE id = ANY (%s::bigint[]) ORDER BY id FOR KEY SHARE
ON CONFLICT (subscriber_id) DO UPDATE SET since = digest_send_now.since
"""


def mark(cur: db.Cursor, subscriber_ids: list[int]) -> int:
    """Mark these subscribers for the next pass, in the caller's transaction; returns rows written."""
    cur.execute(_MARK_SQL, (sorted(subscriber_ids),))
    return int(cur.rowcount)


def mark_from(rows: str) -> str:
    """SQL for a CTE of a planning statement: mark the subscribers whose ids `rows` (a CTE with an
    `id` column) returns."""
    return f"INSERT INTO digest_send_now (subscriber_id) SELECT id FROM {rows} ORDER BY id ON CONFLICT DO NOTHING"


def plan(now: datetime, sending_now: bool = False) -> tuple[int, list[int]]:
    """One pass over digest_send_now. Returns (runs created, ids of those due now).
    `sending_now`: the caller sends the due ones itself (they are marked enqueued, so the checker
    does not enqueue them too); otherwise the checker of the same tick enqueues them."""
    settings = config.get()
    params = {
        "now": now,
        "limit": max(1, settings.digest_plan_batch),
        "max_per_hour": max(0, settings.immediate_max_per_hour),
        "grace": max(0, settings.unseen_grace_seconds),
        "urgent_categories": categories.send_now_keys(categories.registry()),
        "enqueued_at": now if sending_now else None,
    }
    created, due_now = 0, []
    for _ in range(MAX_BATCHES):
        [(seen, consumed, ids, added)] = db.query(_PASS_SQL, params)
        created += added
        due_now += ids
        if seen < params["limit"] or consumed == 0:
            break
    if created:
        later = created - len(due_now)
        log.info(
            "send now: %d run(s) created, %s",
            created,
            f"{len(due_now)} due at once and {later} after UNSEEN_GRACE_SECONDS or the hourly cap"
            if later > 0
            else "all due at once",
        )
    return created, due_now
