"""`python -m app scheduler`: the clock of the system. Safe to run twice.

Leadership: a lease row (app/platform/lease.py), renewed in the background every few seconds. Only the
process holding it ticks; a second scheduler stands by and takes over within one interval when the
leader dies (at once when it stops cleanly). A row and not a session advisory lock: it works behind
PgBouncer in transaction pooling mode. Every job is idempotent anyway (unique keys, SKIP LOCKED), so
a brief overlap could not double-send.

Each tick (every SCHEDULER_INTERVAL_SECONDS):
  1. plan digest runs (digest/plan.py), then send-now runs (digest/immediate.py)
  2. watchdog: stuck `processing` runs back to `pending` / `failed` (a claim no live worker renews;
     after an outage, not before live holders had holds.GRACE_SECONDS to renew theirs)
  3. checker: enqueue due pending runs to the digest queue, bounded by queue depth
  4. hooks of other domains, if installed: scheduled newsletters whose send_at came (started),
     stale newsletter sends, unapplied webhook events,
     event-table partitions ahead and retention (app/platform/retention.py)

"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import time
from datetime import UTC, datetime, timedelta

from app.cli import commands
from app.cli.output import print_json
from app.newsletter.reclaim import reclaim_stale
from app.newsletter.schedule import start_due as start_scheduled_newsletters
from app.platform import config, db, holds, lease, observability, retention
from digest import immediate, plan, seen
from tracking.webhook_apply import requeue_unprocessed

log = logging.getLogger("app.cli.scheduler")

LEASE_NAME = "scheduler"


def lease_seconds(interval: float) -> float:
    """Half an interval, at least 2 s. A standby tries every third of that, so it takes over within
    two thirds of an interval after the leader died (one interval at most for intervals of 4 s and
    more), while a leader renews twice before its lease could run out."""
    return max(2.0, interval / 2)


class Leadership:
    """The scheduler's lease (app/platform/lease.py, row `scheduler` in `leases`): a row rather than a
    session advisory lock, so leadership holds behind PgBouncer in transaction pooling mode."""

    def __init__(self, interval: float | None = None):
        interval = interval if interval is not None else config.get().scheduler_interval_seconds
        self.lease = lease.Lease(LEASE_NAME, lease_seconds(max(0.5, interval)))

    def acquire(self) -> bool:
        """Take or renew leadership now (one statement)."""
        return self.lease.try_acquire()

    def keep(self) -> None:
        """Renew in the background while leading; while standing by, try to take over."""
        self.lease.keep()

    def is_leader(self) -> bool:
        return self.lease.held()

    def release(self) -> None:
        self.lease.release()


def _digest_sender():
    """send(ids) for the checker, and the current queue depth."""
    return plan.enqueue, plan.queue_depth


def _hooks(may_reclaim: bool = True) -> dict:
    """Jobs owned by other packages, run each tick as plain functions."""
    return {
        "newsletter_scheduled": start_scheduled_newsletters,
        "newsletter_reclaim": reclaim_stale if may_reclaim else functools.partial(reclaim_stale, take_back=False),
        "webhook_requeue": requeue_unprocessed,
        "partitions": retention.maintain,
        "feed_state_prune": seen.prune_expired,
    }


def run_hooks(hooks: dict | None = None) -> dict:
    results = {}
    for name, func in (hooks if hooks is not None else _hooks()).items():
        try:
            results[name] = func()
        except Exception:
            log.exception("hook %s failed; continuing the tick", name)
            results[name] = "error"
    return results


def tick(now: datetime | None = None, send=None, depth=None, watched: float | None = None) -> dict:
    """One pass of every job. `send`/`depth` default to the real digest actor and Redis queue.
    Jobs are independent: one failing (logged, reported as "error") does not skip the others.

    `watched`: seconds the scheduler has seen the database without a break (db.watched_seconds).
    Below holds.GRACE_SECONDS — Postgres just came back, and every claim looks old, the live ones
    too — nothing is taken back from its holder this tick (the watchdog, the newsletter reclaim):
    live holders renew their claims first (app/platform/holds.py). None: no such wait (one tick by
    hand, tests)."""
    now = now or datetime.now(UTC)
    result: dict = {"now": now.isoformat()}
    may_reclaim = watched is None or watched >= holds.GRACE_SECONDS

    def job(name, fn, default):
        try:
            return fn()
        except Exception:
            log.exception("scheduler job %s failed; the next tick tries again", name)
            result.setdefault("errors", []).append(name)
            return default

    result["planned"] = job("plan", lambda: plan.plan(now), 0)
    result["send_now"] = job("send_now", lambda: immediate.plan(now)[0], 0)
    if may_reclaim:
        result["reclaimed"], result["failed"] = job("watchdog", lambda: plan.watchdog(now), (0, 0))
    else:
        result["reclaimed"], result["failed"] = 0, 0
        result["reclaim_waits"] = f"the database is back since {watched:.1f} s; live holders renew first"

    def check():
        nonlocal send, depth
        if send is None or depth is None:
            default_send, default_depth = _digest_sender()
            send, depth = send or default_send, depth or default_depth
        return plan.check(now, send, depth())  # depth() fails when Redis is down

    result["enqueued"] = job("checker", check, 0)
    result["hooks"] = run_hooks(_hooks(may_reclaim))
    if any(result[k] for k in ("planned", "send_now", "enqueued", "reclaimed", "failed")) or (
        "errors" in result or "reclaim_waits" in result
    ):
        log.info("tick: %s", result)
    return result


def _watched() -> float:
    """db.watched_seconds(), 0 while the database does not answer."""
    try:
        return db.watched_seconds()
    except db.Error:
        return 0.0


def parse_now(text: str | None) -> datetime | None:
    if not text:
        return None
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("--now needs a UTC offset, e.g. 2026-03-08T14:00:00Z")
    return parsed.astimezone(UTC)


def cmd_scheduler(args) -> int:
    """plan, enqueue and watch digest runs (leader-elected loop)"""
    observability.init_sentry("scheduler")
    db.init()
    try:
        pinned = parse_now(args.now)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def clock() -> datetime:
        if pinned is None:
            return datetime.now(UTC)
        return pinned + timedelta(seconds=time.monotonic() - started)

    interval = max(0.5, config.get().scheduler_interval_seconds)
    leadership = Leadership(interval)
    if args.once:
        if not leadership.acquire():
            print("another scheduler holds the lease; nothing done", file=sys.stderr)
            return 0
        leadership.keep()  # a first tick after a large import outlasts the lease
        try:
            print_json(tick(pinned or clock()))
        finally:
            leadership.release()
        return 0

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    log.info("scheduler up (interval %.1f s)", interval)
    with contextlib.suppress(*db.UNAVAILABLE):  # a database not up yet is the loop's to wait for
        for warning in db.server_warnings():
            log.warning(warning)
    was_leader, last_tick = None, None
    try:
        leadership.acquire()
        leadership.keep()
        while not stopping:
            leader = leadership.is_leader()
            if leader != was_leader:
                log.info("scheduler is %s", "the leader" if leader else "standing by (another scheduler leads)")
                was_leader, last_tick = leader, None  # a new leader ticks at once
            if leader and (last_tick is None or time.monotonic() - last_tick >= interval):
                last_tick = time.monotonic()
                try:
                    tick(clock(), watched=_watched())
                except Exception:
                    log.exception("tick failed; retrying next interval")
            time.sleep(min(0.5, interval))
    except KeyboardInterrupt:
        pass
    finally:
        leadership.release()
    log.info("scheduler stopped")
    return 0


def register(sub) -> None:
    p = commands.add(sub, "scheduler", cmd_scheduler)
    p.add_argument("--once", action="store_true", help="run a single tick and print its result")
    p.add_argument("--now", metavar="ISO8601", help="pin the clock, e.g. 2026-03-08T14:00:00Z")
