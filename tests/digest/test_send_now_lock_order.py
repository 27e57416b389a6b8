"""No deadlock between the writers of digest_send_now (issue 37, item 5).

Production saw the scheduler's plan job die with `deadlock detected … while inserting index tuple in
relation "digest_send_now"`: the hourly hand-off of `immediately` subscribers (digest/plan.py) against
event ingest (digest/ingest.py) marking the same subscribers. The cycle was across two tables: the
hand-off locked the subscribers' rows FOR UPDATE and then inserted their digest_send_now rows, while
ingest inserted digest_send_now rows first and took the subscribers' rows (KEY SHARE, the foreign key
check at the end of its statement) after. The send-now pass and an erasure made the same cycle.

Each test forces the dangerous interleaving with real sessions, one thread each, instead of hoping a
stress loop hits it: a session is held at one step while the other runs into it, and the test waits
(pg_blocking_pids) until that session really waits before it lets the first go on. A deadlock shows
as Postgres' `deadlock detected` error in one of them (after deadlock_timeout, 1 s by default).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from app.operations import erasure
from app.operations.audit import Operator
from app.platform import db
from app.subscribers import records
from digest import immediate, ingest
from digest import plan as digest_plan
from tests import factories
from tests.conftest import wait_for

pytestmark = pytest.mark.direct_db("tells the sessions apart by backend pid (pg_blocking_pids)")


class Session(threading.Thread):
    """One path's work in its own thread and transaction; what it raised is kept for the test."""

    def __init__(self, name: str, work: Callable[[], object]):
        super().__init__(name=name, daemon=True)
        self.work, self.error = work, None

    def run(self) -> None:
        try:
            self.work()
        except Exception as exc:  # the deadlock victim's error, reported by the test
            self.error = exc


@pytest.fixture
def sessions(direct_database_url):
    """(open a connection of the test's own, pids waiting for a given backend, end sessions without errors)."""
    opened = []
    monitor = db.connect_raw(direct_database_url, autocommit=True)

    def connect():
        conn = db.connect_raw(direct_database_url)
        opened.append(conn)
        return conn

    def waiting_for(pid: int) -> list[int]:
        with monitor.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", (pid,))
            return [row[0] for row in cur.fetchall()]

    def finish(*running: Session) -> None:
        """Every session ended, none with an error (a deadlock's victim gets `deadlock detected`)."""
        for session in running:
            session.join(30)
            assert not session.is_alive(), f"{session.name} still waits"
        failed = [f"{s.name}: {type(s.error).__name__}: {s.error}" for s in running if s.error]
        assert not failed, "\n".join(failed)

    yield connect, waiting_for, finish
    for conn in opened:
        conn.close()
    monitor.close()


def pid_of(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def event_row(user_id: str, producer_id: str) -> tuple:
    """A validated row as POST /v1/events hands it to the writer (ingest.Event.row)."""
    return ("test", producer_id, user_id, "like", "post", "p1", "someone", "Someone", "{}", None, None)


def ingest_on(conn, *user_ids: str) -> Callable[[], object]:
    """One group commit of ingest on `conn`: an event for each user, then the commit."""

    def work():
        with conn.cursor() as cur:
            ingest.insert_rows(cur, [[event_row(u, f"ev-{u}") for u in user_ids]])
        conn.commit()

    return work


def send_now_rows() -> list[int]:
    return [row[0] for row in db.query("SELECT subscriber_id FROM digest_send_now ORDER BY 1")]


def handed_off(*ids: int) -> list[bool]:
    rows = db.query("SELECT id, digest_planned_until IS NOT NULL FROM subscribers WHERE id = ANY (%s)", (list(ids),))
    return [dict(rows)[i] for i in ids]


def test_the_hourly_hand_off_and_ingest_of_the_same_subscribers_do_not_deadlock(sessions):
    """Ingest marks A and B while the hourly hand-off takes B. A transaction holding A's row (as an
    erasure's records.lock does) holds ingest inside its mark statement; the hand-off runs meanwhile.
    Before the fix ingest had inserted both digest_send_now rows there and waited in its foreign key
    check of A; the hand-off took B FOR UPDATE and waited for ingest's row B; released, ingest's check
    of B waited for the hand-off: the plan job died "while inserting index tuple in relation
    digest_send_now", as in production."""
    connect, waiting_for, finish = sessions
    a = factories.subscriber("ua", digest_cadence="immediately")
    b = factories.subscriber("ub", digest_cadence="immediately")
    holder, ingesting = connect(), connect()
    with holder.cursor() as cur:
        assert records.lock(cur, a) is not None
    holder_pid, ingest_pid = pid_of(holder), pid_of(ingesting)

    ingest_session = Session("ingest", ingest_on(ingesting, "ua", "ub"))
    ingest_session.start()
    wait_for(lambda: ingest_pid in waiting_for(holder_pid), timeout=30, what="ingest to wait for A's row")
    planner = Session("hourly hand-off", lambda: digest_plan.plan(datetime.now(UTC)))
    planner.start()
    # Either the hand-off runs into ingest's rows (the cycle's first half) or it never meets them.
    wait_for(lambda: not planner.is_alive() or waiting_for(ingest_pid), timeout=30, what="the hand-off to run")
    holder.rollback()

    finish(ingest_session, planner)
    assert send_now_rows() == [a, b]  # ingest marked both, the hand-off B
    assert handed_off(a, b) == [False, True]  # A was held: the next tick hands it off


def test_the_hourly_hand_off_and_a_send_now_pass_do_not_deadlock(sessions):
    """The send-now pass consumes A's and B's marks and makes their runs while the hand-off takes B.
    An open transaction with a live send-now run of A holds the pass at A's insert, after it deleted
    the marks and before its foreign key checks. Before the fix the hand-off took B FOR UPDATE and
    waited for the pass's delete of B's mark; released, the pass's check of B's run waited for the
    hand-off."""
    connect, waiting_for, finish = sessions
    a = factories.subscriber("ua", digest_cadence="immediately")
    b = factories.subscriber("ub", digest_cadence="immediately")
    factories.events("ua")
    factories.events("ub")
    with db.raw_cursor() as cur:
        immediate.mark(cur, [a, b])
    holder = connect()
    with holder.cursor() as cur:
        cur.execute(
            "INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for) "
            "VALUES (%s, 'immediately', '2000-01-01', 0, now())",
            (a,),
        )
    holder_pid = pid_of(holder)

    now = datetime.now(UTC)
    send_now = Session("send-now pass", lambda: immediate.plan(now))
    send_now.start()
    [pass_pid] = wait_for(lambda: waiting_for(holder_pid), timeout=30, what="the pass to wait for A's run")
    planner = Session("hourly hand-off", lambda: digest_plan.plan(now))
    planner.start()
    wait_for(lambda: not planner.is_alive() or waiting_for(pass_pid), timeout=30, what="the hand-off to run")
    holder.rollback()

    finish(send_now, planner)
    runs = db.query("SELECT subscriber_id FROM digest_runs WHERE cadence = 'immediately' ORDER BY 1")
    assert [r[0] for r in runs] == [a, b]  # the pass made both runs
    # The hand-off marked them again after the pass had consumed their marks: the next pass looks.
    assert send_now_rows() == [a, b] and handed_off(a, b) == [True, True]


@pytest.fixture
def erasure_held_after_lock(monkeypatch):
    """erase(user_id) starts a real erasure in a Session; it stops right after records.lock took the
    subscriber's row (FOR UPDATE) until go() is called. Returns (erase, go, the erasure's pid)."""
    locked, released, pids = threading.Event(), threading.Event(), []
    lock = records.lock

    def lock_and_hold(cur, subscriber_id):
        address = lock(cur, subscriber_id)
        cur.execute("SELECT pg_backend_pid()")
        pids.append(cur.fetchone()[0])
        locked.set()
        released.wait(30)
        return address

    monkeypatch.setattr(records, "lock", lock_and_hold)

    def erase(user_id: str) -> Session:
        session = Session("erasure", lambda: erasure.erase_subscriber(user_id, Operator("test")))
        session.start()
        assert locked.wait(30)
        return session

    yield erase, released.set, pids
    released.set()


def test_an_erasure_and_a_send_now_pass_do_not_deadlock(sessions, erasure_held_after_lock):
    """An erasure holds A's row (records.lock) while the send-now pass consumes A's mark and makes
    A's run. Before the fix the pass waited for A's row in its foreign key check, and the erasure's
    delete of A (its digest_send_now row cascades) waited for the pass's delete of that row."""
    _, waiting_for, finish = sessions
    erase, go, erasure_pid = erasure_held_after_lock
    a = factories.subscriber("ua", digest_cadence="immediately")
    factories.events("ua")
    with db.raw_cursor() as cur:
        immediate.mark(cur, [a])
    erasing = erase("ua")
    send_now = Session("send-now pass", lambda: immediate.plan(datetime.now(UTC)))
    send_now.start()
    wait_for(lambda: not send_now.is_alive() or waiting_for(erasure_pid[0]), timeout=30, what="the pass to run")
    go()

    finish(erasing, send_now)
    assert db.query("SELECT count(*) FROM subscribers") == [(0,)]
    assert send_now_rows() == [] and db.query("SELECT count(*) FROM digest_runs") == [(0,)]


def test_an_erasure_while_ingest_marks_the_subscriber_does_not_fail_the_group_commit(sessions, erasure_held_after_lock):
    """Ingest marks A and B while A is being erased. Before the fix ingest inserted A's
    digest_send_now row, waited for A in its foreign key check and, the erasure committed, failed
    with a foreign key violation: the whole group commit (every request in it) rolled back. Taking
    the subscribers' rows first, it finds A gone and marks B only."""
    connect, waiting_for, finish = sessions
    erase, go, erasure_pid = erasure_held_after_lock
    factories.subscriber("ua", digest_cadence="immediately")
    b = factories.subscriber("ub", digest_cadence="immediately")
    erasing = erase("ua")
    ingesting = connect()
    ingest_session = Session("ingest", ingest_on(ingesting, "ua", "ub"))
    ingest_session.start()
    wait_for(lambda: waiting_for(erasure_pid[0]), timeout=30, what="ingest to wait for A's row")
    go()

    finish(erasing, ingest_session)
    assert send_now_rows() == [b]
    assert db.query("SELECT user_id FROM digest_events ORDER BY 1") == [("ua",), ("ub",)]
