"""Scheduler: slots across DST in several zones, planning, checker, watchdog, leadership, hooks, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from app.cli import scheduler
from app.platform import config, db
from app.subscribers import records as subscribers
from digest import plan as digest_plan
from tests import factories
from tests.conftest import wait_for
from tests.digest_support import run_row

ROOT = Path(__file__).resolve().parents[2]
UTC = UTC


def utc(*args):
    return datetime(*args, tzinfo=UTC)


# -- slots ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tz, now, hour, period, slot",
    [
        # New York springs forward on 2026-03-08: 9 am is 14:00Z the day before, 13:00Z that day
        ("America/New_York", utc(2026, 3, 7, 12), 9, date(2026, 3, 7), utc(2026, 3, 7, 14)),
        ("America/New_York", utc(2026, 3, 8, 5), 9, date(2026, 3, 8), utc(2026, 3, 8, 13)),
        # 02:30 does not exist that day: fires right after the gap (03:30 EDT = 07:30Z), once
        ("America/New_York", utc(2026, 3, 8, 5), 2, date(2026, 3, 8), utc(2026, 3, 8, 7)),
        # Berlin falls back on 2026-10-25: 9 am is 07:00Z before, 08:00Z on the day
        ("Europe/Berlin", utc(2026, 10, 24, 3), 9, date(2026, 10, 24), utc(2026, 10, 24, 7)),
        ("Europe/Berlin", utc(2026, 10, 24, 22, 30), 9, date(2026, 10, 25), utc(2026, 10, 25, 8)),
        # 02:00-03:00 happens twice that night: the first occurrence (CEST, 00:00Z)
        ("Europe/Berlin", utc(2026, 10, 24, 22, 30), 2, date(2026, 10, 25), utc(2026, 10, 25, 0)),
        # Berlin springs forward on 2026-03-29
        ("Europe/Berlin", utc(2026, 3, 28, 23), 9, date(2026, 3, 29), utc(2026, 3, 29, 7)),
        # a slot already passed today: tomorrow's
        ("Asia/Tokyo", utc(2026, 1, 1, 1), 9, date(2026, 1, 2), utc(2026, 1, 2, 0)),
    ],
)
def test_daily_slots_across_dst(tz, now, hour, period, slot):
    assert digest_plan.next_slot(now, tz, "daily", hour) == (period, slot)


def test_weekly_slot_on_a_dst_day():
    # Sydney leaves DST on Sunday 2026-04-05 at 03:00: Sunday 9 am is then +10:00
    assert digest_plan.next_slot(utc(2026, 4, 1), "Australia/Sydney", "weekly", 9, 6) == (
        date(2026, 4, 5),
        utc(2026, 4, 4, 23),
    )
    # the Sunday before was still +11:00
    assert digest_plan.next_slot(utc(2026, 3, 25), "Australia/Sydney", "weekly", 9, 6) == (
        date(2026, 3, 29),
        utc(2026, 3, 28, 22),
    )


def test_stagger_is_stable_and_within_the_spread():
    values = [digest_plan.stagger_seconds(i, 3600) for i in range(1, 2000)]
    assert all(0 <= v < 3600 for v in values) and len(set(values)) > 1500
    assert values == [digest_plan.stagger_seconds(i, 3600) for i in range(1, 2000)]


# -- planning ------------------------------------------------------------------------------------
def test_plan_uses_local_slot_plus_stagger_in_two_timezones_on_dst_days(settings):
    settings(digest_stagger_seconds=900)
    ny = factories.subscriber("ny", timezone="America/New_York", digest_hour=9)
    be = factories.subscriber("be", timezone="Europe/Berlin", digest_hour=9, digest_cadence="weekly", digest_weekday=6)
    now = utc(2026, 3, 8, 5)  # NY DST day; next Sunday 2026-03-29 is Berlin's DST day
    assert digest_plan.plan(now) == 2
    ny_run = db.query("SELECT period, scheduled_for FROM digest_runs WHERE subscriber_id = %s", (ny,))[0]
    assert ny_run == (date(2026, 3, 8), utc(2026, 3, 8, 13) + timedelta(seconds=digest_plan.stagger_seconds(ny, 900)))
    now = utc(2026, 3, 28, 12)
    digest_plan.plan(now)
    be_run = db.query(
        "SELECT period, scheduled_for FROM digest_runs WHERE subscriber_id = %s AND period = '2026-03-29'", (be,)
    )[0]
    assert be_run[1] == utc(2026, 3, 29, 7) + timedelta(seconds=digest_plan.stagger_seconds(be, 900))


def test_planning_twice_inserts_nothing_new():
    factories.subscriber("a")
    factories.subscriber("b", digest_cadence="weekly")
    factories.subscriber("off", digest_cadence="off")
    now = utc(2026, 5, 1, 12)
    assert digest_plan.plan(now) == 2
    assert digest_plan.plan(now) == 0
    assert digest_plan.plan(now + timedelta(minutes=1)) == 0


def test_unsubscribed_are_not_planned():
    sid = factories.subscriber("a")
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id = %s", (sid,))
    assert digest_plan.plan(utc(2026, 5, 1, 12)) == 0


def test_cadence_change_cancels_pending_leaves_processing_and_plans_the_new_cadence():
    sid = factories.subscriber("a", digest_hour=9, digest_weekday=4)
    now = utc(2026, 5, 1, 6)  # a Friday
    digest_plan.plan(now)
    (pending_daily,) = [r[0] for r in db.query("SELECT id FROM digest_runs")]
    busy = factories.digest_run(sid, period=date(2026, 4, 30), status="processing")
    subscribers.update(sid, {"digest_cadence": "weekly"})
    assert run_row(pending_daily)["status"] == "cancelled"
    assert run_row(busy)["status"] == "processing"
    assert digest_plan.plan(now) == 1
    weekly = db.query("SELECT cadence, period, status FROM digest_runs WHERE cadence = 'weekly'")
    assert weekly == [("weekly", date(2026, 5, 1), "pending")]
    # switching back within the period brings the cancelled daily run back instead of losing the day
    subscribers.update(sid, {"digest_cadence": "daily"})
    digest_plan.plan(now)
    assert run_row(pending_daily)["status"] == "pending"
    assert db.query("SELECT status FROM digest_runs WHERE cadence = 'weekly'") == [("cancelled",)]


def _planned_until(sid):
    return db.query("SELECT digest_planned_until FROM subscribers WHERE id = %s", (sid,))[0][0]


def test_a_tick_looks_only_at_subscribers_whose_planned_slot_has_passed():
    a = factories.subscriber("a", digest_hour=9)
    b = factories.subscriber("b", digest_hour=18)
    now = utc(2026, 5, 1, 6)
    assert digest_plan.plan(now) == 2
    assert (_planned_until(a), _planned_until(b)) == (utc(2026, 5, 1, 9), utc(2026, 5, 1, 18))
    # a's run vanishing would be re-planned by a full scan; skipping it proves the tick never looked
    db.query("DELETE FROM digest_runs WHERE subscriber_id = %s", (a,))
    assert digest_plan.plan(now + timedelta(hours=2)) == 0
    # a's slot passed: the next period is planned; b's 18:00 slot is still ahead
    assert digest_plan.plan(utc(2026, 5, 1, 9, 1)) == 1
    assert db.query("SELECT subscriber_id, period FROM digest_runs ORDER BY subscriber_id") == [
        (a, date(2026, 5, 2)),
        (b, date(2026, 5, 1)),
    ]
    assert _planned_until(a) == utc(2026, 5, 2, 9) and _planned_until(b) == utc(2026, 5, 1, 18)


def test_planning_goes_in_batches_until_everyone_is_planned(settings):
    settings(digest_plan_batch=3)
    sids = [factories.subscriber(f"u{i}", timezone=("UTC", "Asia/Tokyo")[i % 2]) for i in range(10)]
    assert digest_plan.plan(utc(2026, 5, 1, 12)) == 10
    assert db.query("SELECT count(DISTINCT subscriber_id) FROM digest_runs")[0][0] == 10
    assert all(_planned_until(s) is not None for s in sids)


def test_an_hour_change_moves_the_pending_run_to_the_new_hour():
    sid = factories.subscriber("a", digest_hour=9)
    now = utc(2026, 5, 1, 6)
    digest_plan.plan(now)
    (run,) = [r[0] for r in db.query("SELECT id FROM digest_runs")]
    subscribers.update(sid, {"digest_hour": 20})
    assert (run_row(run)["status"], run_row(run)["skip_reason"]) == ("cancelled", "schedule changed")
    assert _planned_until(sid) is None
    digest_plan.plan(now)  # same period: the cancelled run comes back at the new hour
    row = run_row(run)
    assert row["status"] == "pending" and row["scheduled_for"] >= utc(2026, 5, 1, 20)
    assert db.query("SELECT count(*) FROM digest_runs")[0][0] == 1
    # a change that leaves the schedule as it was cancels nothing
    subscribers.update(sid, {"digest_hour": 20, "name": "Ana"})
    assert run_row(run)["status"] == "pending"


def test_a_subscriber_back_from_off_is_planned_at_once():
    sid = factories.subscriber("a", digest_hour=9)
    now = utc(2026, 5, 1, 6)
    digest_plan.plan(now)
    subscribers.update(sid, {"digest_cadence": "off"})
    assert digest_plan.plan(now) == 0
    assert db.query("SELECT status FROM digest_runs") == [("cancelled",)]
    subscribers.update(sid, {"digest_cadence": "daily"})
    assert digest_plan.plan(now) == 1
    assert db.query("SELECT status FROM digest_runs") == [("pending",)]


def test_two_planners_at_once_plan_each_subscriber_once(settings):

    settings(digest_plan_batch=7)
    for i in range(60):
        factories.subscriber(f"u{i}")
    now, barrier, results = utc(2026, 5, 1, 12), threading.Barrier(2), []

    def planner():
        barrier.wait()
        results.append(digest_plan.plan(now))

    threads = [threading.Thread(target=planner) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(results) == 60
    assert db.query("SELECT count(*), count(DISTINCT subscriber_id) FROM digest_runs")[0] == (60, 60)


# -- checker -------------------------------------------------------------------------------------
def test_checker_enqueues_due_runs_bounded_by_queue_depth(settings):
    settings(digest_claim_batch=2, digest_queue_max_depth=3, digest_reenqueue_seconds=300)
    now = utc(2026, 5, 1, 12)
    due = [
        factories.digest_run(factories.subscriber(f"u{i}"), scheduled_for=now - timedelta(minutes=i + 1))
        for i in range(10)
    ]
    later = factories.digest_run(factories.subscriber("later"), scheduled_for=now + timedelta(minutes=5))
    sent = []
    assert digest_plan.check(now, sent.append, depth=1) == 4  # 2 free message slots x 2 runs
    assert [len(m) for m in sent] == [2, 2]
    assert digest_plan.check(now, sent.append, depth=3) == 0  # queue full
    assert digest_plan.check(now, sent.append, depth=0) == 6  # the rest, never twice
    assert sorted(i for m in sent for i in m) == sorted(due) and later not in [i for m in sent for i in m]
    assert digest_plan.check(now + timedelta(seconds=60), sent.append, depth=0) == 0
    # still pending long after being enqueued: the message was lost; enqueue again
    assert digest_plan.check(now + timedelta(seconds=301), sent.append, depth=0) == 6
    assert run_row(due[-1])["enqueued_at"] == now + timedelta(seconds=301)  # oldest first


def test_enqueue_failure_leaves_runs_for_the_next_tick():
    now = utc(2026, 5, 1, 12)
    rid = factories.digest_run(factories.subscriber("u"), scheduled_for=now - timedelta(minutes=1))

    def broken(ids):
        raise ConnectionError("redis down")

    assert digest_plan.check(now, broken, 0) == 0
    assert run_row(rid)["enqueued_at"] is None


def test_checker_marks_and_sends_in_chunks_and_a_failure_stops_at_its_message(settings, monkeypatch):
    """Each chunk's messages go out right after its commit (workers start while later chunks are
    marked); when Redis refuses a message, that message's runs and every later one stay unmarked."""
    settings(digest_claim_batch=2, digest_queue_max_depth=100)
    monkeypatch.setattr(digest_plan, "CHECK_CHUNK_MESSAGES", 2)
    now = utc(2026, 5, 1, 12)
    due = [
        factories.digest_run(factories.subscriber(f"u{i}"), scheduled_for=now - timedelta(minutes=20 - i))
        for i in range(11)
    ]
    seen_committed = []

    def send(ids):
        # another thread, so another pooled connection: what a worker receiving this message sees
        reader = threading.Thread(
            target=lambda: seen_committed.append(all(run_row(i)["enqueued_at"] == now for i in ids))
        )
        reader.start()
        reader.join()
        if len(seen_committed) == 4:
            raise ConnectionError("redis down")

    assert digest_plan.check(now, send, depth=0) == 6  # messages 1-3 went, the 4th failed
    assert seen_committed == [True, True, True, True]
    assert [run_row(i)["enqueued_at"] is not None for i in due] == [True] * 6 + [False] * 5
    sent = []
    assert digest_plan.check(now, sent.append, depth=0) == 5  # the rest on the next tick, never twice
    assert sorted(i for m in sent for i in m) == due[6:]


# -- watchdog ------------------------------------------------------------------------------------
def test_watchdog_returns_stuck_runs_then_fails_them_keeping_the_error(settings):
    settings(digest_processing_timeout_seconds=600, digest_max_attempts=3)
    now = datetime.now(UTC)
    stuck = factories.digest_run(factories.subscriber("a"), status="processing")
    last = factories.digest_run(factories.subscriber("b"), status="processing")
    fresh = factories.digest_run(factories.subscriber("c"), status="processing")
    db.query("UPDATE digest_runs SET claimed_at = %s WHERE id IN (%s, %s)", (now - timedelta(minutes=11), stuck, last))
    db.query(
        "UPDATE digest_runs SET claimed_at = %s, attempts = 2, last_error = 'SMTP 451 busy' WHERE id = %s",
        (now - timedelta(minutes=11), last),
    )
    db.query("UPDATE digest_runs SET claimed_at = %s WHERE id = %s", (now - timedelta(minutes=1), fresh))
    assert digest_plan.watchdog(now) == (1, 1)
    assert run_row(stuck)["status"] == "pending" and run_row(stuck)["attempts"] == 1
    failed = run_row(last)
    assert failed["status"] == "failed" and failed["attempts"] == 3
    assert "timed out" in failed["last_error"] and "SMTP 451 busy" in failed["last_error"]
    assert run_row(fresh)["status"] == "processing"


# -- leadership and hooks ------------------------------------------------------------------------
def test_only_one_scheduler_leads():
    a, b = scheduler.Leadership(), scheduler.Leadership()
    try:
        assert a.acquire() is True
        assert b.acquire() is False
        assert a.acquire() is True  # still the leader on the next tick
        a.release()
        assert b.acquire() is True
    finally:
        a.release()
        b.release()


def _scheduler_process(log_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": config.get().database_url,
        "REDIS_URL": config.get().redis_url,
        "PYTHONPATH": str(ROOT),
        "LOG_LEVEL": "INFO",
        "SCHEDULER_INTERVAL_SECONDS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "app", "scheduler"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(log_path, "wb"),
    )


def _leader_pid() -> int | None:
    rows = db.query("SELECT holder FROM leases WHERE name = %s AND expires_at > now()", (scheduler.LEASE_NAME,))
    return int(rows[0][0].split(":")[1]) if rows else None


@pytest.mark.slow
def test_two_scheduler_processes_one_leads_the_other_takes_over_when_it_is_killed(redis_client, tmp_path):
    first = _scheduler_process(tmp_path / "first.log")
    second = None
    try:
        wait_for(lambda: _leader_pid() == first.pid, 60, "the first scheduler to lead")
        second = _scheduler_process(tmp_path / "second.log")
        wait_for(lambda: "standing by" in (tmp_path / "second.log").read_text(), 60, "the second to stand by")
        factories.subscriber("a")
        wait_for(lambda: db.query("SELECT 1 FROM digest_runs"), 60, "the leader to plan")
        assert _leader_pid() == first.pid

        os.killpg(first.pid, signal.SIGKILL)  # no clean-up: its lease row stays behind
        first.wait(10)
        wait_for(lambda: _leader_pid() == second.pid, 60, "the standby to take over")
        b = factories.subscriber("b")
        wait_for(
            lambda: db.query("SELECT 1 FROM digest_runs WHERE subscriber_id = %s", (b,)), 60, "the new leader to plan"
        )
        assert "the leader" in (tmp_path / "second.log").read_text()

        os.killpg(second.pid, signal.SIGTERM)  # a clean stop gives the lease up at once
        assert second.wait(30) == 0
        assert db.query("SELECT count(*) FROM leases")[0][0] == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_the_lease_lets_a_standby_take_over_within_an_interval():
    """A standby tries every third of the lease: a dead leader is replaced within 4/3 of it."""
    for interval in (4.0, 30.0, 300.0):
        assert scheduler.lease_seconds(interval) * 4 / 3 <= interval
    assert scheduler.lease_seconds(0.5) == 2.0  # never shorter than 2 s: no flapping on a hiccup


def test_a_failing_hook_does_not_stop_the_others(caplog):
    calls = []

    def explode():
        raise RuntimeError("boom")

    result = scheduler.run_hooks({"bad": explode, "good": lambda: calls.append("good") or 3})
    assert result == {"bad": "error", "good": 3}
    assert calls == ["good"] and "boom" in caplog.text


def test_real_hooks_run_each_tick():
    assert set(scheduler.run_hooks()) == {
        "newsletter_scheduled",
        "newsletter_reclaim",
        "webhook_requeue",
        "partitions",
        "feed_state_prune",
    }


def test_tick_runs_every_job_with_injected_queue():
    factories.subscriber("a", digest_hour=9)
    now = utc(2026, 5, 1, 6)
    sent = []
    result = scheduler.tick(now, send=sent.append, depth=lambda: 0)
    assert result["planned"] == 1 and result["enqueued"] == 0
    result = scheduler.tick(now + timedelta(hours=4), send=sent.append, depth=lambda: 0)
    assert result["enqueued"] == 1 and len(sent) == 1


# -- CLI -----------------------------------------------------------------------------------------
def _cli(*args, **env):
    full_env = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": config.get().database_url,
        "REDIS_URL": config.get().redis_url,
        "PYTHONPATH": str(ROOT),
        "LOG_LEVEL": "WARNING",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "app", *args], env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_cli_scheduler_once_with_pinned_clock(redis_client):
    factories.subscriber("a", timezone="America/New_York", digest_hour=9)
    out = _cli("scheduler", "--once", "--now", "2026-03-08T05:00:00Z")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["planned"] == 1
    assert db.query("SELECT period FROM digest_runs") == [(date(2026, 3, 8),)]


@pytest.mark.slow
def test_cli_preview_digest_writes_html_without_marking(tmp_path):
    factories.subscriber("a")
    factories.events("a", 2)
    target = tmp_path / "preview.html"
    out = _cli("preview-digest", "a", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert "<html" in target.read_text() and "Like from Actor a1 and Actor a0" in target.read_text()
    assert db.query("SELECT count(*) FROM digest_events WHERE digest_run_id IS NOT NULL") == [(0,)]
    assert db.query("SELECT count(*) FROM digest_marks") == [(0,)]
    assert _cli("preview-digest", "nobody").returncode == 1


def test_a_failing_job_does_not_stop_the_others(monkeypatch):
    factories.subscriber("a", digest_hour=9)

    def redis_down():
        raise ConnectionError("redis down")

    result = scheduler.tick(utc(2026, 5, 1, 6), send=lambda ids: None, depth=redis_down)
    assert result["planned"] == 1 and result["enqueued"] == 0 and result["errors"] == ["checker"]
    monkeypatch.setattr(digest_plan, "plan", lambda now: 1 / 0)
    result = scheduler.tick(utc(2026, 5, 1, 6), send=lambda ids: None, depth=lambda: 0)
    assert result["errors"] == ["plan"] and "hooks" in result


def test_digest_now_makes_the_next_digest_due_without_duplicating_the_period():
    a = factories.subscriber("a", digest_hour=9)
    factories.subscriber("b", digest_hour=9)
    factories.events("a", 1)
    now = datetime.now(UTC)
    digest_plan.plan(now)  # a's next run exists, pending
    (planned,) = [r[0] for r in db.query("SELECT id FROM digest_runs WHERE subscriber_id = %s", (a,))]
    assert digest_plan.send_next_now(None, now) == [planned]  # only subscribers with unsent events
    assert run_row(planned)["scheduled_for"] == now
    ids = digest_plan.send_next_now(["b"], now)
    assert len(ids) == 1 and digest_plan.plan(now) == 0


def test_two_concurrent_checkers_enqueue_each_run_once(settings):

    settings(digest_claim_batch=3)
    now = utc(2026, 5, 1, 12)
    runs = [
        factories.digest_run(factories.subscriber(f"u{i}"), scheduled_for=now - timedelta(minutes=1)) for i in range(40)
    ]
    sent, lock, barrier = [], threading.Lock(), threading.Barrier(2)

    def send(ids):
        with lock:
            sent.extend(ids)

    def checker():
        barrier.wait()
        digest_plan.check(now, send, 0)

    threads = [threading.Thread(target=checker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == sorted(runs)
