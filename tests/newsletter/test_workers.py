"""Newsletter work through real Dramatiq workers on real Redis: actors end to end, a worker
SIGKILLed mid-batch, and the outbox builder SIGKILLed mid-way (redelivered because Dramatiq acks
only after the actor returns)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import pytest
from dramatiq.brokers.redis import RedisBroker

from app.newsletter import outbox, reclaim, service
from app.platform import config, db
from tests import factories
from tests.conftest import wait_for
from tests.newsletter_support import counts, newsletter_status

ROOT = Path(__file__).resolve().parents[2]


def start_worker(fake_url: str, queues: tuple[str, ...] = ("newsletter",), **env) -> subprocess.Popen:
    settings = config.get()
    environment = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "MAIL_PROVIDER": "sendgrid",
        "SENDGRID_API_URL": fake_url,
        "SENDGRID_API_KEY": "worker-key",
        "SEND_BATCH_SIZE": "10",
        "NEWSLETTER_SEND_CHAINS": "2",
        "PROVIDER_RATE_PER_SECOND": "0",
        "LOG_LEVEL": "WARNING",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "actors", "--processes", "1", "--threads", "2", "--queues", *queues],
        cwd=ROOT,
        env=environment,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill_worker(proc: subprocess.Popen) -> None:
    """SIGKILL the whole worker (dramatiq's parent and its worker processes): no cleanup runs."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def stop_worker(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        kill_worker(proc)


def redeliver_dead_workers_messages(queue: str = "newsletter"):
    """Consume with a broker that declares workers dead after 0.5 s without a heartbeat: Redis
    maintenance moves the dead worker's un-acked messages back to the queue, and we get them."""
    broker = RedisBroker(url=config.get().redis_url, heartbeat_timeout=500, maintenance_chance=1_000_000)
    broker.declare_queue(queue)
    time.sleep(0.6)
    consumer = broker.consume(queue, prefetch=10, timeout=200)
    messages = []
    for _ in range(10):
        message = next(consumer)
        if message is None:
            if messages:
                break
            continue
        messages.append(message)
    return broker, consumer, messages


def send_to_the_end(fake, nl: int, what: str) -> None:
    """A fresh worker until the newsletter is done."""
    worker = start_worker(fake.url)
    try:
        wait_for(lambda: newsletter_status(nl) == "done", what=what)
    finally:
        stop_worker(worker)


@pytest.mark.slow
def test_actors_send_a_newsletter_end_to_end(fake):
    factories.seed_subscribers(95)
    nl = factories.newsletter()
    worker = start_worker(fake.url)
    try:
        service.request_send(nl, {"kind": "all"})  # enqueues create_outbox on Redis
        wait_for(lambda: newsletter_status(nl) == "done", what="newsletter done")
    finally:
        stop_worker(worker)
    assert counts(nl) == {"sent": 95}
    assert fake.delivered_count == 95 and set(fake.accepted_keys.values()) == {1}
    assert fake.auth_headers == {"Bearer worker-key"}
    assert max(len(r["personalizations"]) for r in fake.requests) == 10  # SEND_BATCH_SIZE per call


# One batch in flight: a held provider call is "mostly waiting", which would grow a second chain.
ONE_CHAIN = {"NEWSLETTER_SEND_CHAINS": "1", "NEWSLETTER_SEND_CHAINS_MAX": "1"}


@pytest.mark.slow
def test_worker_killed_mid_batch_rows_reclaimed_each_recipient_once(fake, settings):
    factories.seed_subscribers(45)
    nl = factories.newsletter()
    fake.hold()  # the provider call will hang ...
    worker = start_worker(fake.url, **ONE_CHAIN)
    try:
        service.request_send(nl, {"kind": "all"})
        wait_for(fake.arrived.is_set, what="a batch at the provider")
        kill_worker(worker)  # ... and the worker dies inside it
    finally:
        if worker.poll() is None:
            kill_worker(worker)
    assert counts(nl) == {"sending": 10, "pending": 35}
    fake.release()  # the provider accepted that batch anyway: the worst case for double sends
    wait_for(lambda: fake.delivered_count == 10, what="the held batch to be accepted")

    settings(reclaim_after_seconds=0)
    assert reclaim.reclaim_stale()["reclaimed_rows"] == 10
    assert counts(nl) == {"pending": 45}
    send_to_the_end(fake, nl, "newsletter done after reclaim")
    assert counts(nl) == {"sent": 45}
    # Every recipient was delivered once; the killed batch was re-sent with the SAME keys, which is
    # what lets an idempotent provider drop the copies.
    assert fake.delivered_count == 45
    assert sorted(m["to"] for m in fake.delivered.values()) == sorted(f"user{i}@example.com" for i in range(1, 46))
    resent = {k for k, n in fake.accepted_keys.items() if n > 1}
    assert len(resent) <= 10 and all(n <= 2 for n in fake.accepted_keys.values())


@pytest.mark.slow
def test_outbox_builder_killed_midway_is_redelivered_and_rerun_without_duplicates(fake):
    factories.seed_subscribers(25_000)
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id %% 1000 = 0")
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    service.pause(nl)  # build the outbox only; sending is not the point
    # Block the third chunk: an uncommitted outbox row for a subscriber in it makes the worker's
    # INSERT … ON CONFLICT wait on our transaction, after two chunks have committed.
    blocker = psycopg2.connect(config.get().database_url)
    blocker.cursor().execute(
        "INSERT INTO email_log (newsletter_id, subscriber_id, email) VALUES (%s, 25000, 'x')", (nl,)
    )
    worker = start_worker(fake.url)
    try:
        wait_for(
            lambda: (
                db.query(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO email_log%%' AND datname = current_database()"
                )[0][0]
                == 1
            ),
            what="outbox builder blocked on the third chunk",
        )
        kill_worker(worker)
    finally:
        if worker.poll() is None:
            kill_worker(worker)
        blocker.rollback()
        blocker.close()
    assert db.query("SELECT count(*) FROM email_log")[0][0] == 20_000  # two chunks, then death
    assert db.query("SELECT outbox_completed_at FROM newsletters")[0][0] is None

    # The message was never acked: once the worker's heartbeat is stale, Dramatiq hands it out again.
    broker, consumer, messages = redeliver_dead_workers_messages()
    outbox_messages = [m for m in messages if m.actor_name == "create_outbox"]
    assert [m.args for m in outbox_messages] == [(nl,)]
    outbox.create_outbox(*outbox_messages[0].args)  # what the actor runs on redelivery
    for message in messages:
        consumer.ack(message)
    broker.close()

    assert db.query("SELECT count(*), count(DISTINCT subscriber_id) FROM email_log")[0] == (25_000, 25_000)
    assert counts(nl) == {"pending": 24_975, "suppressed": 25}
    assert db.query("SELECT outbox_completed_at IS NOT NULL FROM newsletters")[0][0]


@pytest.mark.slow
def test_pause_and_resume_with_a_running_worker(fake):
    factories.seed_subscribers(300)
    nl = factories.newsletter()
    fake.delay = 0.02
    worker = start_worker(fake.url)
    try:
        service.request_send(nl, {"kind": "all"})
        wait_for(lambda: counts(nl).get("sent", 0) >= 30, what="some rows sent")
        service.pause(nl)

        # Batches already at the provider finish; after that nothing is claimed.
        def settled():
            delivered, now = fake.delivered_count, counts(nl)
            return now if "sending" not in now and delivered == now.get("sent", 0) else None

        paused = wait_for(settled, what="in-flight batches to finish")
        assert paused["sent"] + paused["pending"] == 300 and paused["sent"] < 300
        assert service.resume(nl) == "sending"
        wait_for(lambda: newsletter_status(nl) == "done", what="newsletter done after resume")
    finally:
        stop_worker(worker)
    assert counts(nl) == {"sent": 300}
    assert fake.delivered_count == 300 and set(fake.accepted_keys.values()) == {1}


@pytest.mark.slow
def test_sigterm_mid_batch_finishes_and_records_the_batch_then_exits(fake):
    """A deploy: SIGTERM while a batch is at the provider. The worker lets the batch finish (the
    provider is not closed under it), marks it `sent`, exits by itself in bounded time, and a new
    worker sends the rest — every recipient exactly once, nothing to reclaim."""
    factories.seed_subscribers(45)
    nl = factories.newsletter()
    fake.hold()
    worker = start_worker(fake.url, **ONE_CHAIN)
    try:
        service.request_send(nl, {"kind": "all"})
        wait_for(fake.arrived.is_set, what="a batch at the provider")
        os.killpg(worker.pid, signal.SIGTERM)  # the deploy starts ...
        time.sleep(1.0)
        fake.release()  # ... while the provider is still answering
        started = time.monotonic()
        worker.wait(timeout=60)
        assert time.monotonic() - started < 60
    finally:
        if worker.poll() is None:
            kill_worker(worker)
    assert "sending" not in counts(nl)  # the in-flight batch was recorded
    assert counts(nl).get("sent") == 10
    send_to_the_end(fake, nl, "newsletter done after the deploy")
    assert counts(nl) == {"sent": 45}
    assert set(fake.accepted_keys.values()) == {1} and fake.delivered_count == 45
