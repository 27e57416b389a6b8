"""A digest worker SIGKILLed mid-wave sends little twice: outcomes are recorded as a batch goes
(digest/send.py RECORD_EVERY), so of what the relay accepted at most 25 digests per worker thread
were not recorded yet — those the watchdog returns and the next worker sends again (same
Message-IDs). Recorded once per batch of 100 (as before), a thread left up to 100."""

from __future__ import annotations

import re

import pytest

from app.platform import config, db
from tests.conftest import wait_for
from tests.digest_support import SmtpSink
from tests.newsletter.test_workers import kill_worker, start_worker

THREADS = 2  # start_worker's
RUNS = 800
PER_THREAD = 25


def _seed_wave(n: int) -> None:
    """n subscribers, two events each, a run due a minute ago: three statements."""
    db.query(
        "INSERT INTO subscribers (user_id, email, name) "
        "SELECT 'k' || g, 'k' || g || '@example.com', 'K ' || g FROM generate_series(1, %s) g",
        (n,),
    )
    db.query(
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id, "
        "actor_name, payload, occurred_at) "
        "SELECT 'test', 'kill-' || s.id || '-' || i, s.user_id, 'like', 'post', 'p1', 'a' || i, 'Actor ' || i, "
        """'{"title": "Post p1"}', now() - make_interval(secs => 10 - i) """
        "FROM subscribers s, generate_series(1, 2) i"
    )
    db.query(
        "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status) "
        "SELECT id, 'daily', current_date, now() - interval '1 minute', 'pending' FROM subscribers"
    )


@pytest.mark.slow
def test_a_worker_killed_mid_wave_leaves_at_most_25_accepted_digests_a_thread_unrecorded(redis_client):
    from actors import digest as digest_actors

    _seed_wave(RUNS)
    sink = SmtpSink().start()
    sink.delay = 0.005
    settings = config.get()
    # The newsletter tests' worker process (2 threads), on the digest queue and sending over SMTP.
    worker = start_worker("http://127.0.0.1:9", queues=("digest",), MAIL_PROVIDER="smtp", SMTP_URL=sink.url)
    try:
        for _ in range(RUNS // settings.digest_claim_batch + THREADS):  # each claims a batch of what is due
            digest_actors.build_and_send_digest.send()
        # Mid-wave: a few batches recorded, every thread in the middle of one.
        wait_for(lambda: len(sink.raw) >= RUNS // 3, 120, "a third of the wave at the relay")
    finally:
        kill_worker(worker)
        sink.stop()
    delivered = {int(re.search(r"digest-run-(\d+)", m["Message-ID"])[1]) for m in sink.messages()}
    processing = {run_id for (run_id,) in db.query("SELECT id FROM digest_runs WHERE status = 'processing'")}
    unrecorded = delivered & processing  # accepted by the relay, still claimed: sent again after the watchdog
    assert processing, "the kill landed between two batches: nothing was in flight"
    assert len(unrecorded) <= PER_THREAD * THREADS, (
        f"{len(unrecorded)} accepted digests were not recorded when the worker died ({THREADS} threads)"
    )
