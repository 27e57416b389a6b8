"""The scheduler's three digest jobs: plan runs, enqueue due runs (the checker), the watchdog.

Planning. Every active subscriber always has a run for their NEXT delivery slot: daily at
digest_hour local time, weekly on digest_weekday at digest_hour, hourly at the top of every local
hour, in their IANA time zone. Slots are wall-clock times computed with zoneinfo, so DST days work:
a daily slot inside a spring-forward gap (02:30 that never happens) fires at the first instant
after the gap (03:30 new time); a daily slot inside a fall-back overlap (01:30 that happens twice)
fires at the first occurrence, once — the run is unique per (subscriber, cadence, period, slot).
Hourly slots are the instants whose local minute is 0: 23 on a spring-forward day, 25 on a
fall-back day (both 01:00s), each its own `slot` (minutes from the local midnight of `period`).
`scheduled_for` = slot + a stable stagger from a hash of the subscriber id (0 … DIGEST_STAGGER_SECONDS,
at most an hour for hourly) so all 9 am subscribers do not fire in one second.
`immediately` has no slots: its runs are made as events arrive (digest/immediate.py); the planner
only hands such a subscriber to the immediate planner once an hour (IMMEDIATE_RECHECK_SECONDS),
which picks up events left behind by a pause, a resubscribe or an opt-in.

Only subscribers who need a run are looked at: `subscribers.digest_planned_until` holds the slot
their next run was planned for, so a subscriber is due for planning when it is NULL (new, or their
schedule just changed: a trigger clears it and cancels their pending runs, see migration 0004) or
already past. A tick's cost follows the subscribers whose slot passed, not the size of the table.
Slots are computed per distinct (timezone, cadence, hour, weekday) of those — a few hundred
combinations even for millions of subscribers — and each batch of DIGEST_PLAN_BATCH subscribers is
one statement: set digest_planned_until and insert the runs, joined on the combinations.

Checker. Due pending runs are enqueued in batches (one Dramatiq message per DIGEST_CLAIM_BATCH
runs), never letting the queue grow past DIGEST_QUEUE_MAX_DEPTH messages. `enqueued_at` remembers
the hint; a run still pending DIGEST_REENQUEUE_SECONDS after it was enqueued (Redis flushed, message
lost) is enqueued again. Duplicates are harmless: the claim is FOR UPDATE SKIP LOCKED on the row.

Watchdog. A run `processing` longer than DIGEST_PROCESSING_TIMEOUT_SECONDS (its worker died) goes
back to `pending` with attempts + 1; at DIGEST_MAX_ATTEMPTS it becomes `failed`, last error kept.

digest-now (`python -m app digest-now`): make a subscriber's next digest due at once (development).
Every write to digest_runs is a named statement of digest/runs.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from app.platform import config, db, metrics, queue, timezones
from app.subscribers import records
from digest import immediate, marks, messages
from digest import runs as digest_runs

log = logging.getLogger("digest.plan")

HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash; the same formula runs in SQL below
HASH_MODULUS = 2**32


def cadence_spread(cadence: str, stagger_seconds: int) -> int:
    """How far past its slot a run of this cadence may be staggered: DIGEST_STAGGER_SECONDS, at most
    an hour for hourly digests (the next slot comes then)."""
    spread = max(1, stagger_seconds)
    return min(spread, 3600) if cadence == "hourly" else spread


def stagger_seconds(subscriber_id: int, spread: int) -> int:
    if spread <= 0:
        return 0
    return (subscriber_id * HASH_MULTIPLIER % HASH_MODULUS) % spread


def next_slot(now: datetime, tz_name: str, cadence: str, hour: int, weekday: int = 0) -> tuple[date, datetime]:
    """(period, slot in UTC) of the first slot at or after `now`. period = the slot's local date.
    hourly: the next instant whose local minute is 0 (`hour` and `weekday` are ignored).
    immediately (and off) have no slots: ValueError."""
    if cadence == "hourly":
        return _next_top_of_hour(now, timezones.load(tz_name))
    if cadence not in ("daily", "weekly"):
        raise ValueError(f"no slots for cadence {cadence!r}")
    tz = timezones.load(tz_name)
    day = now.astimezone(tz).date()
    step = 1
    if cadence == "weekly":
        day += timedelta(days=(weekday - day.weekday()) % 7)
        step = 7
    day -= timedelta(days=step)  # the previous slot may still be >= now across a DST change
    while True:
        # fold=0: gap times map forward past the gap, repeated times to their first occurrence
        slot = datetime.combine(day, time(hour), tzinfo=tz).astimezone(UTC)
        if slot >= now:
            return day, slot
        day += timedelta(days=step)


_QUARTER = timedelta(minutes=15)


def _next_top_of_hour(now: datetime, tz: ZoneInfo) -> tuple[date, datetime]:
    """Walk UTC quarter hours (every offset in use is a multiple of 15 minutes, Nepal's +05:45
    included) to the first instant >= now whose local minute is 0. Absolute time, so a fall-back
    hour is two slots and a spring-forward gap none."""
    now = now.astimezone(UTC)
    floor = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    candidate = floor if floor >= now else floor + _QUARTER
    while True:
        local = candidate.astimezone(tz)
        if local.minute == 0:
            return local.date(), candidate
        candidate += _QUARTER


def slot_number(cadence: str, period: date, slot: datetime, tz_name: str) -> int:
    """digest_runs.slot: 0 for daily and weekly (one run per period); hourly: the minutes from the
    local midnight of `period` to `slot`, counted in real time, so the two 01:00s of a fall-back day
    are 60 and 120 minutes (New York: 01:00 EDT, 01:00 EST) and never collide."""
    if cadence != "hourly":
        return 0
    midnight = datetime.combine(period, time(0), tzinfo=timezones.load(tz_name)).astimezone(UTC)
    return int((slot - midnight).total_seconds() // 60)


# The partial index subscribers_plan_due_idx (migration 0005) has this predicate.
_ACTIVE = "digest_cadence <> 'off' AND unsubscribed_at IS NULL"
_DUE = f"{_ACTIVE} AND (digest_planned_until IS NULL OR digest_planned_until < %(now)s)"
_DUE_SLOTTED = f"{_DUE} AND digest_cadence <> 'immediately'"

_COMBOS_SQL = f"""
SELECT DISTINCT timezone, digest_cadence,
       CASE WHEN digest_cadence = 'hourly' THEN 0 ELSE digest_hour END,
       CASE WHEN digest_cadence = 'weekly' THEN digest_weekday ELSE 0 END
FROM subscribers WHERE {_DUE_SLOTTED}
"""

_PLANNED_SLOTTED = records.set_planned_until(
    "v.slot",
    source="""due, unnest(%(tz)s::text[], %(cadence)s::text[], %(hour)s::int[], %(weekday)s::int[],
                     %(period)s::date[], %(slot)s::timestamptz[], %(slot_no)s::int[])
              AS v(tz, cadence, hour, weekday, period, slot, slot_no)""",
    match="""s.id = due.id AND s.timezone = v.tz AND s.digest_cadence = v.cadence
      AND (v.cadence = 'hourly' OR s.digest_hour = v.hour)
      AND (v.cadence <> 'weekly' OR s.digest_weekday = v.weekday)""",
    returning="s.id, s.digest_cadence AS cadence, v.period, v.slot, v.slot_no",
)
_PLANNED_IMMEDIATELY = records.set_planned_until(
    "%(now)s + make_interval(secs => %(recheck)s)", source="due", match="s.id = due.id"
)

# How a planning batch takes its subscribers: SKIP LOCKED, so two planners never take the same one;
# NO KEY UPDATE, the lock its UPDATE of digest_planned_until (no key column) takes anyway. Not FOR
# UPDATE: that conflicts with the KEY SHARE every foreign key check of a row naming the subscriber
# takes (digest_send_now, digest_runs, digest_marks), and ingest and the send-now pass take those
# after their own digest_send_now rows, which the hand-off then waits for: a deadlock (issue 37).
_TAKE_DUE = "FOR NO KEY UPDATE SKIP LOCKED"

# One statement per batch, so a subscriber's planned_until and their run commit together. A row
# whose schedule changed since the combinations were read joins no combination: it stays due and
# the next tick plans it.
_PLAN_SQL = f"""
WITH due AS (
    SELECT id FROM subscribers WHERE {_DUE_SLOTTED}
    LIMIT %(limit)s
    {_TAKE_DUE}
), planned AS ({_PLANNED_SLOTTED}), inserted AS ({digest_runs.INSERT_PLANNED})
SELECT (SELECT count(*) FROM planned), (SELECT count(*) FROM inserted)
"""

# `immediately` subscribers due for planning (new, schedule just changed, or an hour since the
# last look) go to the immediate planner, which sends what is waiting for them, if anything.
_PLAN_IMMEDIATELY_SQL = f"""
WITH due AS (
    SELECT id FROM subscribers WHERE {_DUE} AND digest_cadence = 'immediately'
    LIMIT %(limit)s
    {_TAKE_DUE}
), planned AS ({_PLANNED_IMMEDIATELY}), hinted AS ({immediate.mark_from("planned")}
)
SELECT count(*) FROM planned
"""


def plan(now: datetime) -> int:
    """Give every active subscriber whose planned slot has passed (or who has none) the run of their
    next slot. Returns runs inserted (or revived). Each batch commits on its own: a first tick over
    a million new subscribers never holds a million row locks."""
    settings = config.get()
    spread = cadence_spread("daily", settings.digest_stagger_seconds)
    batch = max(1, settings.digest_plan_batch)
    while True:
        [(handed,)] = db.query(
            _PLAN_IMMEDIATELY_SQL, {"now": now, "limit": batch, "recheck": settings.immediate_recheck_seconds}
        )
        if handed < batch:
            break
    cols: dict[str, list] = {k: [] for k in ("tz", "cadence", "hour", "weekday", "period", "slot", "slot_no")}
    for tz_name, cadence, hour, weekday in db.query(_COMBOS_SQL, {"now": now}):
        period, slot = next_slot(now, tz_name, cadence, hour, weekday)
        slot_no = slot_number(cadence, period, slot, tz_name)
        for key, value in zip(cols, (tz_name, cadence, hour, weekday, period, slot, slot_no)):
            cols[key].append(value)
    if not cols["tz"]:
        return 0
    params = {
        **cols,
        "now": now,
        "limit": batch,
        "mult": HASH_MULTIPLIER,
        "mod": HASH_MODULUS,
        "spread": spread,
        "hourly_spread": cadence_spread("hourly", settings.digest_stagger_seconds),
    }
    inserted = 0
    while True:
        [(planned, added)] = db.query(_PLAN_SQL, params)
        inserted += added
        if planned < batch:  # the last batch (or rows that changed meanwhile: the next tick)
            return inserted


# -- checker ----------------------------------------------------------------------------------
def enqueue(run_ids: list[int]) -> None:
    """One message for a worker: these runs are due (a hint; the rows decide)."""
    queue.send(messages.DIGEST_BATCH, run_ids)


def queue_depth() -> int:
    return queue.depth(messages.DIGEST_BATCH.queue)


# Messages marked per transaction: the first go out while later ones are still being marked, instead
# of the workers waiting for one statement that marks every due run.
CHECK_CHUNK_MESSAGES = 10


def check(now: datetime, send, depth: int) -> int:
    """Enqueue due pending runs: `send(list_of_ids)` enqueues one message. `depth` = messages already
    waiting. Returns runs enqueued."""
    settings = config.get()
    batch = max(1, settings.digest_claim_batch)
    budget = settings.digest_queue_max_depth - depth
    if budget <= 0:
        log.info("digest queue holds %d messages (max %d): not enqueueing more", depth, settings.digest_queue_max_depth)
        return 0
    enqueued = 0
    while budget > 0:
        messages = min(budget, CHECK_CHUNK_MESSAGES)
        wanted = messages * batch
        with db.raw_cursor() as cur:
            ids = digest_runs.select_due(cur, now, settings.digest_reenqueue_seconds, wanted)
            if ids:
                digest_runs.mark_enqueued(cur, ids, now)
        sent = _enqueue(ids, batch, send)
        enqueued += sent
        if sent < len(ids) or len(ids) < wanted:  # the queue refused, or nothing more is due
            return enqueued
        budget -= messages
    return enqueued


def _enqueue(ids: list[int], batch: int, send) -> int:
    """After the commit: a worker that gets a message must see the committed rows. Returns runs
    enqueued; on a failure the rest are unmarked and stay pending for the next tick."""
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        try:
            send(chunk)
        except Exception:
            log.exception("enqueueing %d digest runs failed; they stay pending for the next tick", len(chunk))
            with db.raw_cursor() as cur:
                digest_runs.clear_enqueued(cur, ids[start:])
            return start
    return len(ids)


# -- watchdog ---------------------------------------------------------------------------------
def watchdog(now: datetime) -> tuple[int, int]:
    """(returned to pending, failed). Returned runs are due at once: the worker that held them is
    gone, and a re-send carries the same idempotency key."""
    settings = config.get()
    with db.raw_cursor() as cur:
        back, failed = digest_runs.reclaim_stuck(
            cur, now, settings.digest_processing_timeout_seconds, settings.digest_max_attempts, base_seconds=0
        )
    metrics.digest_runs({"retry": back, "failed": failed})  # committed: a rolled-back take-back is not counted
    if back or failed:
        log.warning("watchdog: %d stuck runs back to pending, %d failed after too many attempts", back, failed)
    return back, failed


# -- digest-now -------------------------------------------------------------------------------
_NOW_ALL_SQL = f"""
SELECT s.id, s.timezone, s.digest_cadence, s.digest_hour, s.digest_weekday FROM subscribers s
{marks.JOIN_MARK}
WHERE s.digest_cadence <> 'off' AND s.unsubscribed_at IS NULL
  AND EXISTS (SELECT 1 FROM digest_events e WHERE e.user_id = s.user_id AND {marks.pending()})
"""
_NOW_USERS_SQL = """
SELECT id, timezone, digest_cadence, digest_hour, digest_weekday FROM subscribers
WHERE user_id = ANY (%s) AND digest_cadence <> 'off' AND unsubscribed_at IS NULL
"""


def send_next_now(user_ids: list[str] | None, now: datetime | None = None) -> list[int]:
    """Make each subscriber's NEXT digest due now (all subscribers with unsent events when
    user_ids is None) and return the run ids. A pending run is moved to now; otherwise the run of the
    next slot is created due now, so the planner does not add a second one for that period."""
    now = now or datetime.now(UTC)
    with db.raw_cursor() as cur:
        if user_ids is None:
            cur.execute(_NOW_ALL_SQL)
        else:
            cur.execute(_NOW_USERS_SQL, (list(user_ids),))
        run_ids, send_now = [], []
        for sid, tz_name, cadence, hour, weekday in cur.fetchall():
            if cadence == "immediately":  # no slot: whatever is waiting goes out in a send-now run
                send_now.append(sid)
                continue
            period, slot = next_slot(now, tz_name, cadence, hour, weekday)
            run_ids += digest_runs.make_due_now(
                cur, sid, cadence, period, now, slot_number(cadence, period, slot, tz_name)
            )
        if send_now:
            immediate.mark(cur, send_now)
    if send_now:
        run_ids += immediate.plan(now)[1]
    return run_ids
