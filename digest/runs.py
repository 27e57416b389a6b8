"""digest_runs: the one owner of its state machine.

Every write to digest_runs is a named statement in this module (the schedule-change trigger of
migration 0004 is the only other writer, in SQL, and makes pending → cancelled). The row is the
truth; Dramatiq messages are hints.

  (new)      --plan / digest-now / send now-------> pending
  cancelled  --planned again for the same period--> pending       (a digest slot, or a send-now hour)
  pending    --enqueued / moved due now-----------> pending       (enqueued_at, scheduled_for only)
  pending    --claim------------------------------> processing
  pending    --unsubscribe, schedule change-------> cancelled
  processing --provider accepted------------------> sent          (events marked, same transaction)
  pending    --accepted after the watchdog gave up-> sent         (a late success is still recorded)
  processing --suppressed / nothing to send-------> skipped
  processing --retryable failure, stuck, released-> pending       (attempts + 1, backoff)
  processing --not started: all mail stopped------> pending       (no attempt counted, due at once)
  processing --due inside quiet hours-------------> pending       (no attempt counted, due at the window's end)
  processing --send-now over the day's budget-----> pending       (no attempt counted, due the next local day)
  processing --renewed by its live holder---------> processing    (claimed_at only: app/platform/holds.py)
  processing --permanent failure, attempts used---> failed        (last_error kept)

Only an operator's emergency stop (app/platform/mail_stop.py), a subscriber's quiet hours and their
mail budget return claimed work to `pending` without counting an attempt — the run was never tried. Everything else
counts one, so a run that keeps failing in any way — a poisoned address, a bug, a worker killed
mid-send — ends `failed` after DIGEST_MAX_ATTEMPTS instead of looping. tests/digest/test_runs.py
walks every transition above and checks that no statement makes any other.
"""

from __future__ import annotations

import enum
from datetime import datetime

from app.platform.db import pg_array, pg_text_array
from app.platform.mail_stop import NOT_ENGAGED
from app.subscribers import mailable
from app.subscribers.streams import DIGESTS
from digest import events as digest_events
from digest import marks
from digest.marks import Cover

MAX_BACKOFF_SECONDS = 6 * 3600


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    SENT = "sent"
    SKIPPED = "skipped"
    FAILED = "failed"
    CANCELLED = "cancelled"


P, W, S, K, F, C = (
    RunStatus.PENDING,
    RunStatus.PROCESSING,
    RunStatus.SENT,
    RunStatus.SKIPPED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
)

# (from, to): the only transitions any statement below can make. None = the row is created.
TRANSITIONS = frozenset(
    {
        (None, P),
        (C, P),
        (P, P),
        (P, W),
        (P, C),
        (W, S),
        (P, S),
        (W, K),
        (W, P),
        (W, F),
        (W, W),
    }
)


# -- planning ---------------------------------------------------------------------------------
# The INSERT half of the planner's statement (digest/plan.py adds the subscribers half around
# it): a run of that period that exists already is left as it is; one cancelled by a schedule
# change comes back if the new schedule falls in the same period.
INSERT_PLANNED = """
    INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for)
    SELECT p.id, p.cadence, p.period, p.slot_no,
           p.slot + make_interval(secs => ((p.id::numeric * %(mult)s) %% %(mod)s
                                           %% CASE WHEN p.cadence = 'hourly' THEN %(hourly_spread)s
                                                   ELSE %(spread)s END)::int)
    FROM planned p
    ON CONFLICT ON CONSTRAINT digest_runs_once_per_period DO UPDATE
        SET status = 'pending', scheduled_for = EXCLUDED.scheduled_for, skip_reason = NULL,
            enqueued_at = NULL, claimed_at = NULL, completed_at = NULL
        WHERE digest_runs.status = 'cancelled'
    RETURNING 1
"""

MOVE_DUE_NOW = """
UPDATE digest_runs SET scheduled_for = %(now)s, next_attempt_at = NULL, enqueued_at = NULL
WHERE subscriber_id = %(subscriber_id)s AND cadence = %(cadence)s AND status = 'pending' RETURNING id
"""

INSERT_DUE_NOW = """
INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for)
VALUES (%(subscriber_id)s, %(cadence)s, %(period)s, %(slot)s, %(now)s) ON CONFLICT DO NOTHING RETURNING id
"""


# A send-now run's key: the UTC date and the millisecond of that day it is due at (`f.at`).
_IMMEDIATE_PERIOD = "(f.at AT TIME ZONE 'UTC')::date"
_IMMEDIATE_SLOT = (
    "floor(extract(epoch FROM f.at - date_trunc('day', f.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') * 1000)::int"
)

# The run-making half of the immediate planner's statement (digest/immediate.py adds the rest around
# it): one run per subscriber in `fresh`, due at `at` (now, or when the hourly limit allows). A run
# due now that the caller sends itself is marked enqueued, so the checker does not enqueue it too.
#
# First the revival: a schedule change cancels the pending runs (migration 0004), the one held at the
# hourly limit too; the next run is due at the same allowed hour, so it has the same key, and the
# cancelled row is revived (as the planner's INSERT_PLANNED revives its own) instead of making the
# insert do nothing while the pass consumes the mark.
REVIVE_IMMEDIATE = f"""
    UPDATE digest_runs r SET status = 'pending', skip_reason = NULL, scheduled_for = f.at, next_attempt_at = NULL,
           enqueued_at = CASE WHEN f.at <= %(now)s THEN %(enqueued_at)s::timestamptz END,
           claimed_at = NULL, completed_at = NULL
    FROM fresh f
    WHERE r.subscriber_id = f.id AND r.cadence = 'immediately' AND r.status = 'cancelled'
      AND r.period = {_IMMEDIATE_PERIOD} AND r.slot = {_IMMEDIATE_SLOT}
    RETURNING r.id, r.scheduled_for, r.subscriber_id
"""
# Then the insert, for the others: the partial unique index digest_runs_one_live_immediate turns a
# second live run of a subscriber into nothing.
INSERT_IMMEDIATE = f"""
    INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for, enqueued_at)
    SELECT f.id, 'immediately', {_IMMEDIATE_PERIOD}, {_IMMEDIATE_SLOT},
           f.at, CASE WHEN f.at <= %(now)s THEN %(enqueued_at)s::timestamptz END
    FROM fresh f
    WHERE NOT EXISTS (SELECT 1 FROM revived v WHERE v.subscriber_id = f.id)
    ON CONFLICT DO NOTHING
    RETURNING id, scheduled_for
"""

# A subscriber's critical events (digest/immediate.py): a run of their own, due now, whatever the
# hourly limit; the partial unique index digest_runs_one_live_critical turns a second live one into
# nothing (what arrives meanwhile goes in the next, once this one is sent).
INSERT_CRITICAL = f"""
    INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for, enqueued_at)
    SELECT f.id, 'critical', {_IMMEDIATE_PERIOD}, {_IMMEDIATE_SLOT}, f.at, %(enqueued_at)s::timestamptz
    FROM (SELECT id, %(now)s::timestamptz AS at FROM critical_fresh) f
    ON CONFLICT DO NOTHING
    RETURNING id, scheduled_for
"""


def make_due_now(cur, subscriber_id: int, cadence: str, period, now: datetime, slot: int = 0) -> list[int]:
    """The subscriber's pending run moved to now, or the run of (`period`, `slot`) created due now."""
    params = {"subscriber_id": subscriber_id, "cadence": cadence, "period": period, "slot": slot, "now": now}
    cur.execute(MOVE_DUE_NOW, params)
    rows = cur.fetchall()
    if not rows:
        cur.execute(INSERT_DUE_NOW, params)
        rows = cur.fetchall()
    return [r[0] for r in rows]


# -- the checker's hint -----------------------------------------------------------------------
SELECT_DUE = (
    """
SELECT id FROM digest_runs
WHERE status = 'pending' AND scheduled_for <= %(now)s AND """
    + NOT_ENGAGED
    + """
  AND (next_attempt_at IS NULL OR next_attempt_at <= %(now)s)
  AND (enqueued_at IS NULL OR enqueued_at < %(now)s - make_interval(secs => %(reenqueue)s))
ORDER BY scheduled_for, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
)
MARK_ENQUEUED = "UPDATE digest_runs SET enqueued_at = %s WHERE id = ANY (%s) AND status = 'pending'"
CLEAR_ENQUEUED = "UPDATE digest_runs SET enqueued_at = NULL WHERE id = ANY (%s) AND status = 'pending'"
# After an emergency stop: messages that found the stop were consumed without a claim, so their due
# runs are enqueued again at the next tick instead of after DIGEST_REENQUEUE_SECONDS.
FORGET_ENQUEUED = """
UPDATE digest_runs SET enqueued_at = NULL
WHERE status = 'pending' AND enqueued_at IS NOT NULL AND scheduled_for <= now()
"""


def select_due(cur, now: datetime, reenqueue_seconds: int, limit: int) -> list[int]:
    cur.execute(SELECT_DUE, {"now": now, "reenqueue": reenqueue_seconds, "limit": limit})
    return [row[0] for row in cur.fetchall()]


def mark_enqueued(cur, run_ids: list[int], now: datetime) -> None:
    cur.execute(MARK_ENQUEUED, (now, run_ids))


def clear_enqueued(cur, run_ids: list[int]) -> None:
    cur.execute(CLEAR_ENQUEUED, (run_ids,))


def forget_enqueued(cur) -> int:
    cur.execute(FORGET_ENQUEUED)
    return cur.rowcount


# -- claim ------------------------------------------------------------------------------------
# When the subscriber's previous digest was sent (NULL: never), for "since Tuesday" wording: the
# newest sent run of each cadence, each found by a backward scan of digest_runs_once_per_period
# (subscriber_id, cadence, period, slot) that stops at the first sent row. Daily and weekly
# subscribers count their digests only (a "send now" mail between two does not move "since");
# hourly and immediately subscribers every mail.
# `p.status || ''`: not a condition the partial index digest_runs_sent_idx (completed_at, WHERE
# status = 'sent') can serve. Written plainly, statistics taken before any run was sent (a new
# deployment, a fresh ANALYZE) make the planner walk that index with a filter, a scan that grows with
# every run a wave sends (claims of 100 took 6–23 s in the 100,000-subscriber release bench).
LAST_SENT_AT = """(SELECT max(l.completed_at)
    FROM unnest(CASE WHEN s.digest_cadence IN ('daily', 'weekly') THEN ARRAY['daily', 'weekly']
                     ELSE ARRAY['daily', 'weekly', 'hourly', 'immediately'] END) AS c(cadence)
    CROSS JOIN LATERAL (SELECT p.completed_at FROM digest_runs p
                        WHERE p.subscriber_id = s.id AND p.cadence = c.cadence AND p.status || '' = 'sent'
                        ORDER BY p.period DESC, p.slot DESC LIMIT 1) l)"""

CLAIM = (
    """
WITH picked AS (
    SELECT r.id FROM digest_runs r
    WHERE r.status = 'pending' AND {condition} AND """
    + NOT_ENGAGED
    + """
    ORDER BY r.scheduled_for, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE digest_runs r SET status = 'processing', claimed_at = now()
FROM picked, subscribers s
WHERE r.id = picked.id AND s.id = r.subscriber_id
RETURNING r.id, r.cadence, r.attempts, s.id, s.user_id, s.email, s.name, s.digest_cadence,
          s.token_version, s.tracking_opt_out, """
    + mailable.refusal(DIGESTS)
    + ", s.timezone, "
    + LAST_SENT_AT
    + ", s.locale"
    + ", r.provider"
    + ", s.quiet_hours"
    + ", r.held_at IS NOT NULL"
    + ", s.max_mails_per_day"
)
# The checker decided these are due; a stale duplicate message must still not cut a retry's
# backoff short.
_BY_IDS = "r.id = ANY (%(ids)s::bigint[]) AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= now())"
_ANY_DUE = "r.scheduled_for <= now() AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= now())"

OTHERS_PROCESSING = """
SELECT subscriber_id FROM digest_runs
WHERE status = 'processing' AND subscriber_id = ANY (%s::bigint[]) AND NOT (id = ANY (%s::bigint[]))
"""


def claim(cur, run_ids: list[int] | None, limit: int) -> list[tuple]:
    """pending → processing for the given (or any due) runs; their rows joined with the subscriber."""
    condition = _BY_IDS if run_ids is not None else _ANY_DUE
    cur.execute(CLAIM.format(condition=condition), {"ids": pg_array(run_ids or []), "limit": limit})
    return cur.fetchall()


# Claimers of runs of the same subscriber take turns (a daily run and a "send now" run can be due
# together, in two batches): each claim transaction holds this lock on its subscribers until it
# commits, so the second one's OTHERS_PROCESSING sees the first one's runs `processing`. Sorted,
# so two claimers cannot deadlock; transaction-scoped, so it works behind PgBouncer. unnest keeps
# the array's order.
LOCK_SUBSCRIBERS = """
SELECT count(pg_advisory_xact_lock(%s, (sid %% 2147483647)::int)) FROM unnest(%s::bigint[]) AS sid
"""
SUBSCRIBER_LOCK_CLASS = 0x64696773  # 'digs': the first key of the two-key advisory lock space


def lock_subscribers(cur, subscriber_ids) -> None:
    cur.execute(LOCK_SUBSCRIBERS, (SUBSCRIBER_LOCK_CLASS, pg_array(sorted(set(subscriber_ids)))))


def subscribers_busy_elsewhere(cur, subscriber_ids: list[int], run_ids: list[int]) -> set[int]:
    """Subscribers with another run processing (two runs would read the same unsent events).
    Checked once per batch: as a NOT EXISTS inside the claim, Postgres rescanned every processing
    run once per candidate."""
    cur.execute(OTHERS_PROCESSING, (pg_array(subscriber_ids), pg_array(run_ids)))
    return {row[0] for row in cur.fetchall()}


# -- outcomes ---------------------------------------------------------------------------------
MARK_SKIPPED = """
UPDATE digest_runs r SET status = 'skipped', skip_reason = v.reason, event_count = 0, completed_at = now()
FROM unnest(%s::bigint[], %s::text[]) AS v(id, reason) WHERE r.id = v.id AND r.status = 'processing'
"""

# 'pending' too: if the watchdog gave up on a slow send that then succeeded, record the success so
# the run is not sent again. events_after/events_through: what the run handled (digest/marks.py),
# NULL for a run that marked its events one by one.
MARK_SENT = """
UPDATE digest_runs r SET status = 'sent', event_count = v.n, completed_at = now(),
       provider_message_id = v.mid, provider = v.provider, last_error = NULL, next_attempt_at = NULL,
       events_after = v.after, events_through = v.through
FROM unnest(%s::bigint[], %s::int[], %s::text[], %s::pg_snapshot[], %s::pg_snapshot[], %s::text[])
     AS v(id, n, mid, after, through, provider)
WHERE r.id = v.id AND r.status IN ('processing', 'pending')
RETURNING extract(epoch FROM r.completed_at - r.scheduled_for)
"""

# A run already sent when its record came (the watchdog gave it to a second worker, and both sent
# it under the same Message-ID): what the later one read is covered by the same run.
EXTEND_COVER = """
UPDATE digest_runs r SET events_through = v.through
FROM unnest(%s::bigint[], %s::pg_snapshot[]) AS v(id, through)
WHERE r.id = v.id AND r.status = 'sent' AND r.events_through IS NOT NULL
  AND digest_snapshot_newer(v.through, r.events_through)
"""

# A run skipped with its events handled (only own activity, or all seen in the app).
SET_COVER = """
UPDATE digest_runs r SET events_after = v.after, events_through = v.through
FROM unnest(%s::bigint[], %s::pg_snapshot[], %s::pg_snapshot[]) AS v(id, after, through) WHERE r.id = v.id
"""

# One statement for every way claimed work goes back: a retryable send failure, a run released
# (its subscriber is busy, or the worker hit an error), the watchdog. The attempt is always
# counted; at max attempts the run is `failed` with its error. Exponential backoff with jitter, so
# a provider outage does not end in a stampede.
RETRY = """
UPDATE digest_runs r SET attempts = r.attempts + 1, last_error = left(v.err, 2000),
    claimed_at = NULL, enqueued_at = NULL,
    status = CASE WHEN r.attempts + 1 >= %(max)s THEN 'failed' ELSE 'pending' END,
    completed_at = CASE WHEN r.attempts + 1 >= %(max)s THEN now() END,
    next_attempt_at = now() + make_interval(secs => least(%(cap)s, %(base)s * power(2, r.attempts))
                                                    * (0.8 + random() * 0.4)),
    provider = coalesce(v.provider, r.provider)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[], %(providers)s::text[]) AS v(id, err, provider)
WHERE r.id = v.id AND r.status = 'processing'
RETURNING r.status
"""

# Runs due inside their subscriber's quiet hours (digest/claim.py): back to pending, due when the
# window ends, no attempt counted. What the subscriber gets meanwhile joins them (a send-now pass
# makes no second run while one waits), so the window's end brings one mail.
# A run held by the mail budget (an `immediately` subscriber's day is spent) waits for the next local
# day the same way, without `held_at`: it is not mail of quiet hours ("while you were away").
HOLD = """
UPDATE digest_runs r SET status = 'pending', claimed_at = NULL, enqueued_at = NULL,
    scheduled_for = greatest(r.scheduled_for, v.until), next_attempt_at = v.until,
    held_at = CASE WHEN v.away THEN coalesce(r.held_at, now()) ELSE r.held_at END
FROM unnest(%s::bigint[], %s::timestamptz[], %s::boolean[]) AS v(id, until, away)
WHERE r.id = v.id AND r.status = 'processing'
"""

# Runs whose mail was never started because all mail was stopped: not their fault, no attempt.
RELEASE = """
UPDATE digest_runs SET status = 'pending', claimed_at = NULL, enqueued_at = NULL
WHERE id = ANY (%s) AND status = 'processing'
"""

FAIL = """
UPDATE digest_runs r SET status = 'failed', last_error = left(v.err, 2000), completed_at = now(),
    attempts = r.attempts + 1, claimed_at = NULL
FROM unnest(%s::bigint[], %s::text[]) AS v(id, err) WHERE r.id = v.id AND r.status = 'processing'
"""

STUCK = """
SELECT id, 'processing timed out after ' || %(timeout)s || ' s'
           || coalesce('; previous error: ' || last_error, '')
FROM digest_runs
WHERE status = 'processing' AND claimed_at < %(now)s - make_interval(secs => %(timeout)s)
FOR UPDATE SKIP LOCKED
"""

# A live holder's claim, renewed (app/platform/holds.py): runs being recorded right now are skipped,
# so the renewal never waits for (or deadlocks with) the holder's own writes.
RENEW = """
UPDATE digest_runs SET claimed_at = now() WHERE id IN (
    SELECT id FROM digest_runs WHERE id = ANY (%s::bigint[]) AND status = 'processing' ORDER BY id
    FOR UPDATE SKIP LOCKED)
"""

CANCEL_PENDING = """
UPDATE digest_runs SET status = 'cancelled', skip_reason = %s WHERE subscriber_id = %s AND status = 'pending'
"""


def mark_skipped(cur, skipped: list[tuple[int, str]]) -> None:
    if skipped:
        cur.execute(MARK_SKIPPED, ([i for i, _ in skipped], [reason for _, reason in skipped]))


def mark_events(cur, handled: list[tuple[int, list[int]]], covers: dict[int, tuple[int, Cover]] | None = None) -> None:
    """[(run_id, event_ids)]: the events a run handled (sent, or never to be shown: the subscriber's
    own activity in a run skipped for having nothing else) are never loaded again. A run in
    `covers` ({run_id: (subscriber_id, cover)}) moves its subscriber's mark; the others mark their
    events one by one."""
    covers = covers or {}
    # Runs that mark their events one by one (digest/marks.py says which).
    digest_events.mark_handled(cur, [(eid, run_id) for run_id, ids in handled if run_id not in covers for eid in ids])
    covered = [(run_id, covers[run_id]) for run_id, _ in handled if run_id in covers]
    if covered:
        marks.advance(cur, [c for _, c in covered])
        cur.execute(
            SET_COVER,
            ([r for r, _ in covered], [c.after for _, (_, c) in covered], [c.through for _, (_, c) in covered]),
        )


def mark_sent(cur, sent: list[tuple], covers: dict[int, tuple[int, Cover]] | None = None) -> list[float]:
    """[(run_id, event_ids, provider message id[, provider])]: the events and the runs in one
    transaction (`covers` as in mark_events); `provider` names who accepted the mail. Returns each
    marked run's lateness: seconds from scheduled_for to now."""
    if not sent:
        return []
    covers = covers or {}
    providers = [item[3] if len(item) > 3 else None for item in sent]
    sent = [item[:3] for item in sent]
    per_event = [(run_id, ids) for run_id, ids, _ in sent if run_id not in covers]
    if per_event:
        mark_events(cur, per_event)
    covered = [covers[run_id] for run_id, _, _ in sent if run_id in covers]
    if covered:
        marks.advance(cur, covered)
    after = [covers[r][1].after if r in covers else None for r, _, _ in sent]
    through = [covers[r][1].through if r in covers else None for r, _, _ in sent]
    cur.execute(
        MARK_SENT,
        (
            pg_array([r for r, _, _ in sent]),
            pg_array([len(ids) for _, ids, _ in sent]),
            pg_text_array([m for _, _, m in sent]),
            pg_text_array(after),
            pg_text_array(through),
            pg_text_array(providers),
        ),
    )
    lateness = [float(row[0]) for row in cur.fetchall()]
    if len(lateness) < len(sent) and covered:  # some were final already: keep the mark and the run agreeing
        late = [(r, covers[r][1].through) for r, _, _ in sent if r in covers]
        cur.execute(EXTEND_COVER, ([r for r, _ in late], [t for _, t in late]))
    return lateness


def retry(cur, failures: list[tuple], max_attempts: int, base_seconds: float) -> tuple[int, int]:
    """processing → pending (backoff) or failed (attempts used up). Returns (pending, failed).
    [(run_id, error[, provider])]: a provider given is one whose answer never came (an ambiguous
    outcome): the run is pinned to it, and kept pinned by later retries that name none."""
    if not failures:
        return 0, 0
    cur.execute(
        RETRY,
        {
            "ids": [f[0] for f in failures],
            "errors": [f[1] for f in failures],
            "providers": [f[2] if len(f) > 2 else None for f in failures],
            "max": max_attempts,
            "cap": MAX_BACKOFF_SECONDS,
            "base": base_seconds,
        },
    )
    statuses = [row[0] for row in cur.fetchall()]
    return statuses.count("pending"), statuses.count("failed")


def hold(cur, held: list[tuple[int, datetime]], away: bool = True) -> None:
    """processing → pending, due at `until` (no attempt counted): when the subscriber's quiet hours end
    (`away`: the mail says "while you were away"), or their next local day (the mail budget)."""
    if held:
        cur.execute(HOLD, ([i for i, _ in held], [u for _, u in held], [away] * len(held)))


def release(cur, run_ids: list[int]) -> None:
    """processing → pending, due at once, no attempt counted (the emergency stop held them back)."""
    if run_ids:
        cur.execute(RELEASE, (list(run_ids),))


def fail(cur, failures: list[tuple[int, str]]) -> None:
    """processing → failed: retrying cannot help (the address or the message is refused)."""
    if failures:
        cur.execute(FAIL, ([i for i, _ in failures], [e for _, e in failures]))


def reclaim_stuck(cur, now: datetime, timeout_seconds: int, max_attempts: int, base_seconds: float) -> tuple[int, int]:
    """The watchdog: runs whose claim is older than the timeout (their worker died: a live one
    renews it, app/platform/holds.py) are retried like any other failure. Returns (back to
    pending, failed)."""
    cur.execute(STUCK, {"now": now, "timeout": timeout_seconds})
    return retry(cur, cur.fetchall(), max_attempts, base_seconds)


def renew(cur, run_ids: list[int]) -> int:
    """The claim on these runs, still `processing`, renewed by their live holder; how many."""
    cur.execute(RENEW, (run_ids,))
    return int(cur.rowcount)


def cancel_pending(cur, subscriber_id: int, reason: str) -> None:
    cur.execute(CANCEL_PENDING, (reason, subscriber_id))


def ids_of(cur, subscriber_id: int) -> list[int]:
    """Every run of this subscriber (right to erasure: their digests' links, history and counters go)."""
    cur.execute("SELECT id FROM digest_runs WHERE subscriber_id = %s", (subscriber_id,))
    return [row[0] for row in cur.fetchall()]
