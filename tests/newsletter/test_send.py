"""Newsletter sending in process against real Postgres/Redis and a real local fake SendGrid."""

from __future__ import annotations

import collections

import pytest

from app.newsletter import outbox, ratelimit, rows, sender, service
from app.platform import config, db
from tests import factories
from tests.newsletter_support import counts, drain, newsletter_status, start


def assert_each_once(fake, newsletter_id):
    """Every sent row was delivered exactly once (accepted once, by idempotency key)."""
    sent_rows = [
        r[0]
        for r in db.query("SELECT id FROM email_log WHERE newsletter_id = %s AND status = 'sent'", (newsletter_id,))
    ]
    keys = {f"newsletter-{newsletter_id}-row-{r}" for r in sent_rows}
    delivered = {k for k in fake.delivered if k.startswith(f"newsletter-{newsletter_id}-")}
    assert delivered == keys
    assert all(fake.accepted_keys[k] == 1 for k in keys), [k for k in keys if fake.accepted_keys[k] != 1]
    recipients = collections.Counter(fake.delivered[k]["to"] for k in keys)
    assert all(n == 1 for n in recipients.values())
    return recipients


def test_each_recipient_gets_own_mail_once_in_batched_calls(fake, provider, settings):
    settings(send_batch_size=100)
    factories.seed_subscribers(250)
    nl = factories.newsletter()
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 250}
    assert newsletter_status(nl) == "done"
    assert fake.calls == 3  # 100 + 100 + 50 recipients: one POST per batch
    assert fake.auth_headers == {"Bearer test-key"}
    recipients = assert_each_once(fake, nl)
    assert len(recipients) == 250
    mail = next(m for m in fake.delivered.values() if m["to"] == "user7@example.com")
    assert mail["subject"] == "Hi User 7"
    assert "Hello User 7," in mail["html"] and 'style="color:#333"' in mail["html"]  # CSS inlined
    assert "User 7" in mail["text"] and "{{" not in mail["html"] + mail["text"]
    assert mail["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    unsubscribe = mail["headers"]["List-Unsubscribe"].strip("<>").split(">")[0]
    assert unsubscribe in mail["html"]  # the visible link is the one-click URL
    row_id = db.query(
        "SELECT e.id FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id WHERE s.email = 'user7@example.com'"
    )[0][0]
    assert mail["custom_args"] == {
        "mail_kind": "newsletter",
        "mail_id": str(nl),
        "row_id": str(row_id),
        "subscriber_id": "7",
        "idempotency_key": f"newsletter-{nl}-row-{row_id}",
    }
    assert db.query("SELECT count(*) FROM email_log WHERE provider_message_id IS NULL OR sent_at IS NULL")[0][0] == 0


def test_default_batch_is_the_providers_own(fake, provider):
    """SEND_BATCH_SIZE 0 (the default): SendGrid gets up to 500 recipients per API call."""
    factories.seed_subscribers(250)
    nl = factories.newsletter()
    start(nl)
    first = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    assert first.claimed == 250 and fake.calls == 1


def test_suppressed_and_unsubscribed_are_never_sent(fake, provider):
    factories.seed_subscribers(20)
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id IN (1, 2)")
    factories.suppression("user3@example.com", "bounce")
    db.query("UPDATE subscribers SET email = 'USER4@Example.com' WHERE id = 4")
    factories.suppression("user4@example.com", "spamreport")
    nl = factories.newsletter()
    start(nl)
    assert counts(nl) == {"pending": 16, "suppressed": 4}
    # After the outbox was built: an unsubscribe and a suppression still win at claim time (I6).
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id = 5")
    factories.suppression("user6@example.com", "unsubscribe")
    drain(nl, provider)
    assert counts(nl) == {"sent": 14, "suppressed": 6}
    sent_to = {m["to"] for m in fake.delivered.values()}
    assert not sent_to & ({f"user{i}@example.com" for i in range(1, 7)} | {"USER4@Example.com"})
    errors = dict(db.query("SELECT subscriber_id, error FROM email_log WHERE status = 'suppressed'"))
    assert errors[1] == "unsubscribed" and errors[3] == "suppressed: bounce"
    assert errors[5] == "unsubscribed before send" and errors[6] == "suppressed before send: unsubscribe"
    assert newsletter_status(nl) == "done"


def test_audience_of_user_ids(fake, provider):
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    start(nl, {"kind": "user_ids", "user_ids": ["u3", "u5", "u8", "nobody"]})
    drain(nl, provider)
    assert counts(nl) == {"sent": 3}
    assert sorted(m["to"] for m in fake.delivered.values()) == [
        "user3@example.com",
        "user5@example.com",
        "user8@example.com",
    ]


def test_outbox_rerun_creates_no_duplicates(fake, provider):
    factories.seed_subscribers(120)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    assert outbox.create_outbox(nl, chunk_ids=7) == 120
    db.query("UPDATE newsletters SET outbox_completed_at = NULL WHERE id = %s", (nl,))
    assert outbox.create_outbox(nl, chunk_ids=7) == 0  # a redelivered message: every row exists
    assert counts(nl) == {"pending": 120}


def test_outbox_builder_refreshes_statistics_so_claims_walk_the_pending_index(fake, provider):
    """Stale statistics made every claim sort all pending rows (0.8 s per claim at a million): after the
    outbox is built the claim walks an index in id order and stops at its limit."""
    factories.seed_subscribers(3000)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    analyzed = "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'email_log'"
    before = db.query(analyzed)[0][0]
    outbox.create_outbox(nl, chunk_ids=500)
    assert db.query(analyzed)[0][0] >= before + 2  # after the first chunk, as it grew, at the end
    db.query("UPDATE newsletters SET status = 'sending' WHERE id = %s", (nl,))
    plan = "\n".join(r[0] for r in db.query("EXPLAIN " + rows.CLAIM, {"nl": nl, "limit": 100, "after": 0}))
    # The CTE's own lines (deeper than the join below it, whose shape depends on the table sizes):
    # it walks an index in id order and stops at 100.
    picked = plan.split("CTE picked")[1].split("\n  ->  ")[0]
    assert "Sort" not in picked and "Bitmap" not in picked and "Index Scan using email_log_" in picked, plan


def test_claims_move_forward_but_a_row_left_behind_is_still_sent_in_the_same_pass(fake, provider, settings):
    """The send loop's claim cursor skips what it already passed; a row that becomes pending behind
    it (a peer released it, its backoff came due) is found by the closing claim from the start."""
    settings(send_batch_size=10)
    factories.seed_subscribers(40)
    nl = factories.newsletter()
    start(nl)
    first_row = db.query("SELECT min(id) FROM email_log WHERE newsletter_id = %s", (nl,))[0][0]

    class LeavesOneBehind:
        name, max_batch = provider.name, provider.max_batch
        calls = 0

        def send_batch(self, mails, progress=None):
            self.calls += 1
            if self.calls == 1:  # while the first batch is out, its first row goes back to pending
                db.query("UPDATE email_log SET status = 'pending' WHERE id = %s", (first_row,))
            return provider.send_batch(mails, progress)

    wrapped = LeavesOneBehind()
    stats = sender.send_batch(nl, provider=wrapped, reenqueue=False, budget_seconds=60)
    assert counts(nl) == {"sent": 40}
    assert stats.claimed == 41 and wrapped.calls == 5  # 4 batches forward, then the one left behind


def test_one_outbox_builder_at_a_time_and_a_dead_ones_lease_runs_out(monkeypatch, redis_client):
    """The builder holds a lease (a row: it works behind PgBouncer). While a living builder renews
    it, a duplicate message gives up; a builder that died leaves its lease to run out, and the
    redelivered message waits for that, then builds."""
    from app.platform import lease

    monkeypatch.setattr(outbox, "LEASE_SECONDS", 1.0)
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    living = lease.Lease(outbox.lease_name(nl), 1.0)
    try:
        assert living.try_acquire()
        living.keep()
        assert outbox.create_outbox(nl) == 0  # another worker is building it
        assert counts(nl) == {}
        living.stop_renewing()  # that worker was SIGKILLed
        assert outbox.create_outbox(nl) == 30  # the redelivered message builds
    finally:
        living.release()
    assert db.query("SELECT count(*) FROM leases")[0][0] == 0  # released when done


def test_reclaim_leaves_an_outbox_alone_while_its_builder_lives(redis_client):
    from app.newsletter import reclaim
    from app.platform import lease

    factories.seed_subscribers(5)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    db.query("UPDATE newsletters SET send_requested_at = now() - interval '5 minutes'")
    builder = lease.Lease(outbox.lease_name(nl), 30)
    assert builder.try_acquire()
    assert reclaim.reclaim_stale()["outbox_kicked"] == []
    db.query("UPDATE leases SET expires_at = now() - interval '1 second'")  # it died; the lease ran out
    assert reclaim.reclaim_stale()["outbox_kicked"] == [nl]


def test_pause_stops_claims_and_resume_continues_exactly(fake, provider, settings):
    settings(send_batch_size=10)
    factories.seed_subscribers(55)
    nl = factories.newsletter()
    start(nl)
    first = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    assert first.sent == 10
    service.pause(nl)
    paused = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=60)
    assert paused.claimed == 0 and counts(nl) == {"sent": 10, "pending": 45}
    assert fake.calls == 1
    assert service.resume(nl) == "sending"
    drain(nl, provider)
    assert counts(nl) == {"sent": 55}
    assert len(assert_each_once(fake, nl)) == 55
    assert newsletter_status(nl) == "done"


def test_pause_mid_batch_lets_claimed_rows_finish(fake, provider, settings):
    """A pause while a batch is at the provider: that batch completes, nothing new is claimed."""
    settings(send_batch_size=10)
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    start(nl)

    class PausingProvider:
        name, max_batch = "sendgrid", 1000

        def send_batch(self, mails, progress=None):
            service.pause(nl)  # the operator clicks pause during the call
            return provider.send_batch(mails, progress)

    stats = sender.send_batch(nl, provider=PausingProvider(), reenqueue=False, budget_seconds=60)
    assert stats.claimed == 10 and stats.sent == 10
    assert counts(nl) == {"sent": 10, "pending": 20}
    service.resume(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 30}
    assert len(assert_each_once(fake, nl)) == 30


def test_429_storm_slows_down_then_delivers_everything_once(fake, provider, settings, monkeypatch):
    settings(send_batch_size=20, provider_rate_per_second=0)
    factories.seed_subscribers(100)
    nl = factories.newsletter()
    start(nl)
    fake.throttle_for(1.5)
    rounds = drain(nl, provider)
    assert any("throttled" in r.outcome for r in rounds)
    assert fake.status_counts[429] >= 1
    assert counts(nl) == {"sent": 100}
    assert len(assert_each_once(fake, nl)) == 100
    assert db.query("SELECT max(attempts) FROM email_log")[0][0] == 1  # throttles do not use attempts


def test_transient_errors_back_off_then_fail_after_max_attempts(fake, provider, settings, monkeypatch):
    monkeypatch.setattr(sender, "BACKOFF_BASE_SECONDS", 0.0)
    settings(send_batch_size=5, newsletter_max_attempts=2)
    factories.seed_subscribers(5)
    nl = factories.newsletter()
    start(nl)
    fake.fail_next(1, status=503)
    stats = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    assert stats.retry == 5 and counts(nl) == {"pending": 5}
    assert (
        db.query("SELECT count(*) FROM email_log WHERE next_attempt_at IS NOT NULL AND error LIKE 'SendGrid 503%%'")[0][
            0
        ]
        == 5
    )
    fake.fail_next(1, status=503)
    stats = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    assert stats.failed == 5 and counts(nl) == {"failed": 5}
    drain(nl, provider)
    assert newsletter_status(nl) == "done"
    assert fake.delivered_count == 0
    final = "SELECT final_counts FROM newsletters WHERE id = %s"
    assert db.query(final, (nl,))[0][0] == {"failed": 5}
    result = service.retry_failed(nl)
    assert result == service.Requeued(id=nl, status="sending", requeued=5)
    assert db.query(final, (nl,))[0][0] is None  # reopened: counted live again
    drain(nl, provider)
    assert counts(nl) == {"sent": 5} and newsletter_status(nl) == "done"
    assert db.query(final, (nl,))[0][0] == {"sent": 5}
    assert len(assert_each_once(fake, nl)) == 5


@pytest.mark.parametrize("status", [400, 401, 403])
def test_hard_rejection_fails_rows(fake, provider, status):
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)
    fake.fail_next(1, status=status)
    drain(nl, provider)
    assert counts(nl) == {"failed": 3}
    assert db.query("SELECT min(error) FROM email_log")[0][0].startswith(f"SendGrid {status}")


def test_cancel_stops_everything_not_yet_claimed(fake, provider, settings):
    settings(send_batch_size=10)
    factories.seed_subscribers(40)
    nl = factories.newsletter()
    start(nl)
    sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    assert service.cancel(nl) == service.Cancelled(id=nl, status="cancelled", cancelled_rows=30)
    drain(nl, provider)
    assert counts(nl) == {"sent": 10, "cancelled": 30}
    assert fake.delivered_count == 10
    assert newsletter_status(nl) == "cancelled"


def test_reclaim_moves_stale_sending_rows_back_and_rekicks(fake, provider, settings, redis_client):
    settings(send_batch_size=10, reclaim_after_seconds=60)
    factories.seed_subscribers(25)
    nl = factories.newsletter()
    start(nl)
    # A worker claimed a batch and died: rows stuck in `sending`.
    claimed = db.thread_connection.call(sender.newsletter_rows.claim, nl, 10, 0)
    assert len(claimed) == 10
    from app.newsletter import reclaim

    assert reclaim.reclaim_stale()["reclaimed_rows"] == 0  # not stale yet
    db.query("UPDATE email_log SET claimed_at = now() - interval '2 minutes' WHERE status = 'sending'")
    redis_client.flushdb()  # and Redis lost every message
    result = reclaim.reclaim_stale()
    assert result["reclaimed_rows"] == 10 and result["chains_kicked"] == [nl]
    assert redis_client.llen("dramatiq:newsletter") >= 1  # work is queued again
    drain(nl, provider)
    assert counts(nl) == {"sent": 25}
    assert len(assert_each_once(fake, nl)) == 25


def test_reclaim_rekicks_unfinished_outbox_when_nobody_builds_it(redis_client):
    factories.seed_subscribers(5)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    redis_client.flushdb()
    from app.newsletter import reclaim

    assert reclaim.reclaim_stale()["outbox_kicked"] == []  # just requested: message likely queued
    db.query("UPDATE newsletters SET send_requested_at = now() - interval '5 minutes'")
    assert reclaim.reclaim_stale()["outbox_kicked"] == [nl]
    assert redis_client.llen("dramatiq:newsletter") == 1


def test_rate_limit_ceiling_is_shared_and_adaptive(redis_client):
    limiter = ratelimit.AdaptiveRateLimiter("test", client=redis_client, ceiling=100)
    other_worker = ratelimit.AdaptiveRateLimiter("test", client=redis_client, ceiling=100)
    assert limiter.reserve(100) == (True, 0.0)  # a second's worth of burst
    granted, wait = other_worker.reserve(50, max_wait=5)  # the bucket is shared: this one waits
    assert granted and 0.4 <= wait <= 0.6
    granted, wait = other_worker.reserve(1000, max_wait=1)  # too long: not granted, nothing taken
    assert not granted and wait > 1
    limiter.throttled(retry_after=0.5)
    assert limiter.current_rate() == 50  # 429: halved ...
    other_worker.throttled(retry_after=0.5)
    assert limiter.current_rate() == 50  # ... once per storm, not once per worker
    assert other_worker.reserve(1, max_wait=0.1)[0] is False  # everyone waits for the reset
    for _ in range(20):
        limiter.succeeded()
    assert limiter.current_rate() is None  # recovered gradually to the ceiling


def test_unlimited_rate_adapts_only_after_a_429(redis_client):
    limiter = ratelimit.AdaptiveRateLimiter("free", client=redis_client, ceiling=0)
    assert limiter.reserve(10_000) == (True, 0.0)
    limiter.throttled(retry_after=0)
    assert limiter.current_rate() == ratelimit.ADAPTIVE_START_RATE
    for _ in range(200):
        limiter.succeeded()
    assert limiter.current_rate() is None


def test_flushed_redis_loses_no_work_send_chains_rekicked(fake, provider, settings, redis_client):
    settings(send_batch_size=10)
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    start(nl)  # kicked send chains: messages + alive mark in Redis
    assert redis_client.llen("dramatiq:newsletter") >= 1
    sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    from app.newsletter import reclaim

    assert reclaim.reclaim_stale()["chains_kicked"] == []  # chains alive: nothing to do
    redis_client.flushdb()  # every message and mark gone (I3)
    assert reclaim.reclaim_stale()["chains_kicked"] == [nl]
    assert redis_client.llen("dramatiq:newsletter") == settings().newsletter_send_chains
    drain(nl, provider)
    assert counts(nl) == {"sent": 30}
    assert len(assert_each_once(fake, nl)) == 30


def test_low_rate_ceiling_paces_batches(fake, provider, settings, redis_client):
    settings(send_batch_size=100, provider_rate_per_second=5)
    factories.seed_subscribers(12)
    nl = factories.newsletter()
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 12}
    assert [len(r["personalizations"]) for r in fake.requests] == [5, 5, 2]  # one second's worth per call
    assert redis_client.exists("notify:ratelimit:sendgrid")  # the shared bucket in Redis


def test_works_with_the_file_provider_too(tmp_path, redis_client):
    """The send loop is provider-agnostic: the development file provider gets the same mails."""
    import email

    from app.platform.providers.file import FileProvider

    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)
    drain(nl, FileProvider(str(tmp_path)))
    assert counts(nl) == {"sent": 3}
    files = sorted(tmp_path.glob("*.eml"))
    assert len(files) == 3
    message = email.message_from_bytes(files[0].read_bytes())
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert message["List-Unsubscribe"].startswith(f"<{config.get().base_url}/u/")
    assert message["Subject"] == "Hi User 1"


def test_cancel_works_in_chunks(fake, provider, monkeypatch):
    monkeypatch.setattr(outbox, "CANCEL_CHUNK", 7)
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    start(nl)
    assert service.cancel(nl).cancelled_rows == 30
    assert counts(nl) == {"cancelled": 30}


def test_cancel_while_the_outbox_is_building(fake, provider):
    factories.seed_subscribers(50)
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    calls = []

    def cancel_after_first_chunk(inserted):
        calls.append(inserted)
        if len(calls) == 1:
            service.cancel(nl)

    outbox.create_outbox(nl, chunk_ids=10, on_chunk=cancel_after_first_chunk)
    assert calls == [10]  # stopped at the next chunk
    assert counts(nl) == {"cancelled": 10}
    drain(nl, provider)
    assert fake.calls == 0


def test_reclaim_marks_a_finished_newsletter_done(fake, provider, redis_client):
    """The last worker died after marking its rows but before the done check: the tick closes it."""
    factories.seed_subscribers(4)
    nl = factories.newsletter()
    start(nl)
    sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=0)
    db.query("UPDATE newsletters SET status = 'sending', completed_at = NULL WHERE id = %s", (nl,))
    from app.newsletter import reclaim

    assert reclaim.reclaim_stale()["finished"] == [nl]
    assert newsletter_status(nl) == "done"
