"""Leases (app/platform/lease.py): one holder at a time, renewed while it lives, taken over once it died.
They are rows, so they hold behind PgBouncer in transaction pooling mode (the PgBouncer pass of
`make test` runs this module through one)."""

from __future__ import annotations

from app.platform import db, lease
from tests.conftest import wait_for


def row(name: str):
    rows = db.query("SELECT holder, expires_at, acquired_at FROM leases WHERE name = %s", (name,))
    return rows[0] if rows else None


def test_one_holder_at_a_time_renewal_keeps_it_release_hands_it_over():
    a, b = lease.Lease("job", 30), lease.Lease("job", 30)
    assert a.try_acquire() and a.held()
    first = row("job")
    assert first[0] == a.holder
    assert not b.try_acquire() and not b.held()
    assert a.try_acquire()  # a renewal: later expiry, same acquisition
    renewed = row("job")
    assert renewed[1] > first[1] and renewed[2] == first[2]
    a.release()
    assert not a.held() and row("job") is None
    assert b.try_acquire() and row("job")[0] == b.holder
    b.release()


def test_names_are_independent():
    a, b = lease.Lease("one", 30), lease.Lease("two", 30)
    assert a.try_acquire() and b.try_acquire()
    a.release()
    b.release()


def test_an_expired_lease_is_taken_over_at_once():
    db.query(
        "INSERT INTO leases (name, holder, expires_at) VALUES ('job', 'dead-host:1:x', now() - interval '1 second')"
    )
    b = lease.Lease("job", 30)
    assert b.try_acquire()
    assert row("job")[0] == b.holder
    b.release()


def test_release_never_deletes_another_holders_lease():
    a, b = lease.Lease("job", 30), lease.Lease("job", 30)
    assert a.try_acquire()
    b.release()  # b never held it
    assert row("job")[0] == a.holder
    a.release()


def test_a_living_holder_keeps_its_lease_a_dead_one_is_taken_over_by_the_standby():
    """Two would-be holders renewing in the background (as two schedulers do). The standby never
    gets the lease while the holder renews it; once the holder stops renewing — what a SIGKILL
    looks like from outside — the standby takes it over within the lease plus a third of it."""
    a, b = lease.Lease("job", 2), lease.Lease("job", 2)
    try:
        assert a.try_acquire()
        a.keep()
        b.keep()
        start = row("job")[1]
        wait_for(lambda: row("job")[1] > start, 10, "a renewal in the background")
        renewed = row("job")[1]
        wait_for(lambda: row("job")[1] > renewed, 10, "a second renewal")
        assert row("job")[0] == a.holder and not b.held()
        a.stop_renewing()  # a died: its row stays behind
        wait_for(b.held, 10, "the standby to take over")
        assert row("job")[0] == b.holder
        wait_for(lambda: not a.held(), 10, "the dead holder's own view to run out")
        assert not a.try_acquire()  # a late renewal does not steal it back
    finally:
        a.release()
        b.release()
    assert row("job") is None


def test_acquire_waits_for_a_dead_holders_lease_but_not_for_a_living_one():
    a = lease.Lease("job", 1)
    try:
        assert a.try_acquire()
        a.keep()
        assert not lease.Lease("job", 1).acquire(wait=1.5)  # renewed meanwhile: gave up
        a.stop_renewing()
        late = lease.Lease("job", 1)
        assert late.acquire(wait=5)  # ran out within its second
        late.release()
    finally:
        a.release()
