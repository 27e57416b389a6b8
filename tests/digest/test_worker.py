"""End to end through Dramatiq: scheduler tick -> Redis -> a real Worker -> SMTP sink. Redis is a hint."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.cli import scheduler
from app.platform import db
from tests import factories
from tests.conftest import wait_for
from tests.digest_support import marked, sink_as_provider


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings, digest_claim_batch=3) as s:
        yield s


@pytest.fixture
def worker(redis_client):
    import dramatiq

    import actors

    w = dramatiq.Worker(actors.broker, worker_threads=2, worker_timeout=100, queues={"digest"})
    yield w
    w.stop()


def _statuses():
    # (a tick at the due time also plans each subscriber's NEXT run: those stay pending)
    return dict(db.query("SELECT status, count(*) FROM digest_runs GROUP BY status"))


def _setup(n=5):
    ids = []
    for i in range(n):
        factories.subscriber(f"u{i}", digest_hour=9)
        ids += factories.events(f"u{i}", 3)
    return ids


@pytest.mark.slow
def test_redis_flushed_after_planning_next_tick_still_delivers(sink, worker, redis_client):
    events = _setup(5)
    now = datetime(2026, 5, 1, 6, tzinfo=UTC)
    assert scheduler.tick(now)["planned"] == 5
    redis_client.flushdb()  # Redis lost everything
    result = scheduler.tick(now + timedelta(hours=4))
    assert result["enqueued"] == 5
    worker.start()
    wait_for(lambda: _statuses().get("sent") == 5)
    assert len(sink.messages()) == 5 and None not in marked(events).values()


@pytest.mark.slow
def test_redis_flushed_after_enqueue_runs_are_enqueued_again(sink, worker, redis_client, settings):
    settings(digest_reenqueue_seconds=120)
    _setup(4)
    now = datetime(2026, 5, 1, 6, tzinfo=UTC)
    scheduler.tick(now)
    due = now + timedelta(hours=4)
    assert scheduler.tick(due)["enqueued"] == 4
    redis_client.flushdb()  # the messages are gone, the rows say "enqueued"
    assert scheduler.tick(due + timedelta(seconds=30))["enqueued"] == 0
    assert scheduler.tick(due + timedelta(seconds=121))["enqueued"] == 4
    worker.start()
    wait_for(lambda: _statuses().get("sent") == 4)
    ids = [m["Message-ID"] for m in sink.messages()]
    assert len(ids) == 4 == len(set(ids))


@pytest.mark.slow
def test_duplicate_messages_send_once(sink, worker, redis_client):
    _setup(3)
    import actors

    run_ids = [factories.digest_run(sid) for (sid,) in db.query("SELECT id FROM subscribers ORDER BY id")]
    for _ in range(3):  # the same hint three times
        actors.digest.build_and_send_digest.send(run_ids)
    actors.digest.build_and_send_digest.send()  # and a claim-anything message
    worker.start()
    wait_for(lambda: _statuses() == {"sent": 3})
    worker.stop()
    assert len(sink.messages()) == 3


def test_idle_workers_look_at_their_queues_every_worker_idle_poll_ms(settings, redis_client):
    """Dramatiq's idle consumers back off up to 1 s between fetches; the worker set-up
    (actors/broker.py IdlePoll) bounds that by WORKER_IDLE_POLL_MS, whatever the Worker was given."""
    import dramatiq

    import actors

    settings(worker_idle_poll_ms=150)
    w = dramatiq.Worker(actors.broker, worker_threads=1, queues={"digest"})
    w.start()
    try:
        assert w.worker_timeout == 150
        assert w.consumers and {c.worker_timeout for c in w.consumers.values()} == {150}
    finally:
        w.stop()
