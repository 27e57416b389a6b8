"""digest/runs.py is the one owner of digest_runs: every statement, applied to a run in every
status, makes only the transitions its docstring lists — and together they make all of them."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from app.platform import db
from digest import immediate, runs
from digest import plan as digest_plan
from digest.runs import TRANSITIONS, RunStatus
from tests import factories

NOW = datetime(2026, 5, 4, 12, tzinfo=UTC)
_seq = itertools.count()


def _run_in(status: RunStatus) -> tuple[int, int]:
    """A subscriber (daily at 09:00 UTC) and the run of today's slot in `status`, claimed long ago."""
    sid = factories.subscriber(f"s{next(_seq)}", digest_hour=9)
    period, slot = digest_plan.next_slot(NOW - timedelta(hours=4), "UTC", "daily", 9)
    rid = factories.digest_run(
        sid, period=period, scheduled_for=slot, status=status.value, claimed_at=NOW - timedelta(days=1)
    )
    db.query("UPDATE subscribers SET digest_planned_until = NULL WHERE id = %s", (sid,))
    return sid, rid


def _statuses(sid: int) -> set[str]:
    return {r[0] for r in db.query("SELECT status FROM digest_runs WHERE subscriber_id = %s", (sid,))}


def _with_cursor(work):
    def apply(sid, rid):
        with db.raw_cursor() as cur:
            work(cur, sid, rid)

    return apply


OPERATIONS = {
    "plan": lambda sid, rid: digest_plan.plan(NOW - timedelta(hours=4)),
    "make_due_now": _with_cursor(
        lambda cur, sid, rid: runs.make_due_now(
            cur, sid, "daily", digest_plan.next_slot(NOW - timedelta(hours=4), "UTC", "daily", 9)[0], NOW
        )
    ),
    "mark_enqueued": _with_cursor(lambda cur, sid, rid: runs.mark_enqueued(cur, [rid], NOW)),
    "clear_enqueued": _with_cursor(lambda cur, sid, rid: runs.clear_enqueued(cur, [rid])),
    "claim": _with_cursor(lambda cur, sid, rid: runs.claim(cur, [rid], 10)),
    "mark_skipped": _with_cursor(lambda cur, sid, rid: runs.mark_skipped(cur, [(rid, "no events")])),
    "mark_sent": _with_cursor(lambda cur, sid, rid: runs.mark_sent(cur, [(rid, [], "mid")])),
    "retry": _with_cursor(lambda cur, sid, rid: runs.retry(cur, [(rid, "451 busy")], 5, 60)),
    "retry_last_attempt": _with_cursor(lambda cur, sid, rid: runs.retry(cur, [(rid, "451 busy")], 1, 60)),
    "fail": _with_cursor(lambda cur, sid, rid: runs.fail(cur, [(rid, "550 no such user")])),
    "release": _with_cursor(lambda cur, sid, rid: runs.release(cur, [rid])),
    "hold": _with_cursor(lambda cur, sid, rid: runs.hold(cur, [(rid, NOW + timedelta(hours=6))])),
    "forget_enqueued": _with_cursor(lambda cur, sid, rid: runs.forget_enqueued(cur)),
    "reclaim_stuck": _with_cursor(lambda cur, sid, rid: runs.reclaim_stuck(cur, NOW, 900, 5, 0)),
    "renew": _with_cursor(lambda cur, sid, rid: runs.renew(cur, [rid])),
    "cancel_pending": _with_cursor(lambda cur, sid, rid: runs.cancel_pending(cur, sid, "unsubscribed")),
    "schedule_trigger": lambda sid, rid: db.query("UPDATE subscribers SET digest_hour = 10 WHERE id = %s", (sid,)),
    "send_now": lambda sid, rid: _send_now(sid),
}


def _send_now(sid: int) -> None:
    """An urgent event and its hint, then a send-now pass (digest/immediate.py)."""
    ((user_id,),) = db.query("SELECT user_id FROM subscribers WHERE id = %s", (sid,))
    db.query("UPDATE digest_events SET high_priority = true WHERE id = ANY (%s)", (factories.events(user_id),))
    db.query("INSERT INTO digest_send_now (subscriber_id) VALUES (%s)", (sid,))
    immediate.plan(NOW)


def test_every_statement_makes_only_documented_transitions_and_all_of_them_are_made():
    seen = set()
    for name, operation in OPERATIONS.items():
        for status in RunStatus:
            sid, rid = _run_in(status)
            operation(sid, rid)
            after = _statuses(sid)
            for new in after - {status.value}:
                pair = (status, RunStatus(new)) if len(after) == 1 else (None, RunStatus(new))
                assert pair in TRANSITIONS, f"{name} made {pair[0]} -> {pair[1]}, which runs.py does not list"
                seen.add(pair)
    fresh = factories.subscriber("fresh", digest_hour=9)  # no run yet: planning creates one
    digest_plan.plan(NOW)
    assert _statuses(fresh) == {"pending"}
    seen.add((None, RunStatus.PENDING))
    # pending -> pending (re-enqueued, moved due now) and processing -> processing (a claim renewed)
    # change no status; the rest must all occur.
    unchanged = {(RunStatus.PENDING, RunStatus.PENDING), (RunStatus.PROCESSING, RunStatus.PROCESSING)}
    missing = TRANSITIONS - seen - unchanged
    assert not missing, f"transitions listed but never made: {missing}"


def test_only_the_emergency_stop_and_quiet_hours_return_a_run_untried_and_without_an_attempt():
    sid, rid = _run_in(RunStatus.PROCESSING)
    OPERATIONS["release"](sid, rid)
    ((status, attempts, claimed_at),) = db.query(
        "SELECT status, attempts, claimed_at FROM digest_runs WHERE id = %s", (rid,)
    )
    assert (status, attempts, claimed_at) == ("pending", 0, None)
    sid, rid = _run_in(RunStatus.PROCESSING)
    OPERATIONS["hold"](sid, rid)
    ((status, attempts, due),) = db.query(
        "SELECT status, attempts, greatest(scheduled_for, next_attempt_at) FROM digest_runs WHERE id = %s", (rid,)
    )
    assert (status, attempts, due) == ("pending", 0, NOW + timedelta(hours=6))


def test_claimed_work_never_goes_back_to_pending_without_an_attempt():
    for name in ("retry", "reclaim_stuck"):
        sid, rid = _run_in(RunStatus.PROCESSING)
        OPERATIONS[name](sid, rid)
        ((status, attempts),) = db.query("SELECT status, attempts FROM digest_runs WHERE id = %s", (rid,))
        assert (status, attempts) == ("pending", 1), name


def test_the_claim_finds_the_previous_mail_by_the_unique_key_whatever_the_statistics_say():
    """Statistics taken before any run was sent (a new deployment, a fresh ANALYZE) once made the
    claim's "when was the previous mail" subquery walk the dashboard's partial index of sent runs
    with a filter, a scan that grows with every run a wave sends: it must probe the unique key."""
    factories.seed_subscribers(20_000)
    db.query(
        "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for) "
        "SELECT id, 'daily', current_date, now() - interval '1 minute' FROM subscribers"
    )
    db.query("ANALYZE digest_runs")
    with db.raw_cursor() as cur:
        cur.execute("EXPLAIN " + runs.CLAIM.format(condition=runs._ANY_DUE), {"ids": [], "limit": 100})
        plan = "\n".join(line for (line,) in cur.fetchall())
    assert "digest_runs_sent_idx" not in plan, plan
    assert "Index Scan Backward using digest_runs_once_per_period on digest_runs p" in plan, plan
