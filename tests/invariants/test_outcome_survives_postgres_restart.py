"""An outcome the provider accepted is kept and written once Postgres answers again — never thrown
away and sent a second time (Postgres restarting between the send and the commit)."""

from __future__ import annotations

import threading
import time

import pytest

from app.platform import config, db
from app.platform.providers.smtp import SMTPProvider
from digest import send as digest_send
from tests import factories
from tests import newsletter_support as nl
from tests.conftest import wait_for
from tests.digest_support import SmtpSink, marked, run_row
from tests.fake_sendgrid import FakeSendGrid
from tests.tcp_proxy import TcpProxy

OUTAGE_SECONDS = 1.5


@pytest.fixture
def postgres_through_proxy(settings, database_url):
    """Call it once the test has seeded its rows: from then on the workers' connections go through
    a proxy the test can cut."""
    proxy, url = TcpProxy.for_url(database_url)

    def route_through_proxy():
        settings(database_url=url)
        return proxy

    yield route_through_proxy
    proxy.cut()
    db.init(database_url)  # a first import of `actors` meanwhile binds the pool to the current URL


class RestartAfterSend:
    """Hands the batch to a real provider, then 'restarts Postgres': every connection is dropped
    and new ones are refused for OUTAGE_SECONDS."""

    def __init__(self, provider, proxy):
        self.provider, self.proxy = provider, proxy
        self.name, self.max_batch = provider.name, provider.max_batch

    def send_batch(self, mails, progress=None):
        results = self.provider.send_batch(mails, progress)
        self.proxy.cut()
        threading.Timer(OUTAGE_SECONDS, self.proxy.restore).start()
        return results


@pytest.fixture
def relay():
    sink = SmtpSink().start()
    provider = SMTPProvider(sink.url, pool_size=2)
    yield sink, provider
    provider.close()
    sink.stop()


def _five_digest_runs() -> tuple[list[int], list[int]]:
    """(run ids, event ids): five subscribers with two events each and a run each."""
    runs, events = [], []
    for i in range(5):
        sid = factories.subscriber(f"u{i}")
        events += factories.events(f"u{i}", 2)
        runs.append(factories.digest_run(sid))
    return runs, events


def test_a_slice_sent_before_an_outage_is_recorded_once_and_the_rest_retry(
    postgres_through_proxy, relay, settings, caplog
):
    """Postgres goes away after the first slice of a batch was handed over (digest/send.py slices):
    that slice is recorded when it returns, never sent again; the runs not begun retry."""
    sink, provider = relay
    settings(digest_build_events=4)  # slices of 2 runs of 2 events
    runs, events = _five_digest_runs()
    proxy = postgres_through_proxy()
    counts = digest_send.process(runs, provider=RestartAfterSend(provider, proxy))
    assert counts["sent"] == 2 and counts["retry"] == 3
    assert [run_row(r)["status"] for r in runs] == ["sent", "sent", "pending", "pending", "pending"]
    assert len(sink.raw) == 2
    assert "database unavailable" in caplog.text  # the outage really hit the recording
    db.query("UPDATE digest_runs SET next_attempt_at = NULL")
    assert digest_send.process(runs, provider=provider)["sent"] == 3
    assert len(sink.raw) == 5  # once each: nothing re-sent
    assert set(marked(events).values()) == set(runs)


def test_digests_sent_during_an_outage_are_recorded_when_postgres_returns(postgres_through_proxy, relay, caplog):
    sink, provider = relay
    runs, events = _five_digest_runs()
    proxy = postgres_through_proxy()
    counts = digest_send.process(runs, provider=RestartAfterSend(provider, proxy))
    assert counts["sent"] == 5
    assert {run_row(r)["status"] for r in runs} == {"sent"}
    assert len(sink.raw) == 5  # once each: nothing re-sent
    assert set(marked(events).values()) == set(runs)
    assert "database unavailable" in caplog.text  # the outage really hit the recording


def test_newsletter_rows_sent_during_an_outage_are_marked_when_postgres_returns(
    postgres_through_proxy, redis_client, caplog
):
    from app.newsletter import sender
    from app.platform.providers.sendgrid import SendGridProvider

    factories.seed_subscribers(20)
    newsletter_id = factories.newsletter()
    nl.start(newsletter_id)
    with FakeSendGrid() as fake:
        provider = SendGridProvider(api_key="k", api_url=fake.url)
        proxy = postgres_through_proxy()
        stats = sender.send_batch(
            newsletter_id, provider=RestartAfterSend(provider, proxy), reenqueue=False, budget_seconds=60
        )
        provider.close()
        assert stats.sent == 20
        assert nl.counts(newsletter_id) == {"sent": 20}
        assert sum(fake.accepted_keys.values()) == 20  # once each
    assert db.query("SELECT count(*) FROM email_log WHERE attempts <> 1")[0][0] == 0
    assert "database unavailable" in caplog.text


@pytest.mark.direct_db("holds a lock on its own direct connection and finds the waiting backend by its pid")
def test_runs_whose_release_hit_the_outage_are_released_as_soon_as_postgres_returns(
    postgres_through_proxy, direct_database_url
):
    """Postgres restarts while a batch is being built: the build fails, and so does the first try to
    give the claimed runs back. They must not wait DIGEST_PROCESSING_TIMEOUT_SECONDS for the
    watchdog: the release goes through as soon as Postgres answers again."""
    import psycopg2

    runs = []
    for i in range(5):
        sid = factories.subscriber(f"u{i}")
        factories.events(f"u{i}", 2)
        runs.append(factories.digest_run(sid))
    proxy = postgres_through_proxy()
    db.init(config.get().database_url)  # the pool too goes through the proxy
    holder = psycopg2.connect(direct_database_url)
    outcome: list = []
    try:
        with holder.cursor() as cur:  # the build will wait for this lock: the claim is committed
            cur.execute("LOCK TABLE digest_events IN ACCESS EXCLUSIVE MODE")

        def work():
            try:
                outcome.append(digest_send.process(runs))
            except Exception as exc:
                outcome.append(exc)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()

        def build_waiting():
            with holder.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'digest_events'::regclass"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
                return cur.fetchone()[0] > 0

        wait_for(build_waiting, 60, "the build to wait for the locked table")
        assert {run_row(r)["status"] for r in runs} == {"processing"}
        proxy.cut()  # the restart: the build's query fails, so does the release
        holder.rollback()
        restart = threading.Timer(0.5, proxy.restore)
        restart.start()
        worker.join(60)
        restart.join()
        assert not worker.is_alive()
    finally:
        holder.close()
    assert isinstance(outcome[0], psycopg2.OperationalError)
    rows = [run_row(r) for r in runs]
    assert {(r["status"], r["attempts"]) for r in rows} == {("pending", 1)}  # back, without the watchdog


# -- an outage longer than the claim timeout, mid-send, with the reclaimers running -------------------
BLINK_TIMEOUT_SECONDS = 3  # RECLAIM_AFTER_SECONDS / DIGEST_PROCESSING_TIMEOUT_SECONDS in these tests
LONG_OUTAGE_SECONDS = 5  # longer than the timeout, and than the old write deadline (2.4 s)


class Scheduler:
    """The scheduler's loop, on its own thread and connections through the proxy: a tick every 0.2 s
    with how long it has seen the database (its reclaimers wait after an outage)."""

    def __init__(self):
        self.stop, self.errors = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from datetime import UTC, datetime

        from app.cli import scheduler

        while not self.stop.wait(0.2):
            try:
                scheduler.tick(datetime.now(UTC), send=lambda ids: None, depth=lambda: 0, watched=scheduler._watched())
            except Exception:
                self.errors += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def long_outage(postgres_through_proxy, settings, monkeypatch):
    """cut_after(sink, n): Postgres goes away once the sink took n mails, for LONG_OUTAGE_SECONDS;
    claims time out after BLINK_TIMEOUT_SECONDS, and the renewer and the reclaimers' grace run at
    test speed."""
    from app.platform import holds

    settings(reclaim_after_seconds=BLINK_TIMEOUT_SECONDS, digest_processing_timeout_seconds=BLINK_TIMEOUT_SECONDS)
    monkeypatch.setattr(holds, "CHECK_SECONDS", 0.1)
    monkeypatch.setattr(holds, "GRACE_SECONDS", 1.0)
    proxy = postgres_through_proxy()
    db.init(config.get().database_url)  # the scheduler's pooled jobs too go through the proxy
    timers: list[threading.Thread] = []

    def cut_after(sink, n: int):
        def watch():
            wait_for(lambda: len(sink.raw) >= n, 60, f"{n} mails at the relay")
            proxy.cut()
            time.sleep(LONG_OUTAGE_SECONDS)
            proxy.restore()

        timers.append(threading.Thread(target=watch, daemon=True))
        timers[-1].start()

    yield cut_after
    for t in timers:
        t.join(60)


def _until(work, done, seconds: float = 90):
    """work() again until done(), through the outage (a claim fails while Postgres is away)."""
    deadline = time.monotonic() + seconds
    while True:
        assert time.monotonic() < deadline, "the send did not finish"
        try:
            if done():
                return
            work()
        except db.UNAVAILABLE:
            db.thread_connection.reset()
            time.sleep(0.2)


def test_a_newsletter_batch_cut_off_longer_than_the_claim_timeout_sends_nobody_twice(long_outage, relay, caplog):
    """Postgres goes away mid-batch for longer than RECLAIM_AFTER_SECONDS while the scheduler runs:
    the batch starts no further mail once it cannot record, keeps what the relay accepted until
    Postgres answers, and the reclaimer leaves the live worker's rows alone. Everyone gets one copy."""
    from app.newsletter import sender

    sink, provider = relay
    sink.delay = 0.02
    factories.seed_subscribers(60)
    newsletter_id = factories.newsletter()
    nl.start(newsletter_id)
    long_outage(sink, 10)
    stats: list[sender.SendStats] = []

    def send():
        stats.append(sender.send_batch(newsletter_id, provider=provider, reenqueue=False, budget_seconds=60))

    with Scheduler():
        _until(send, lambda: nl.counts(newsletter_id) == {"sent": 60})
    delivered = [m["Message-ID"] for m in sink.messages()]
    assert len(delivered) == 60 and len(set(delivered)) == 60  # one copy each
    assert "no further mail of the batch is started" in caplog.text  # the outage hit a flush
    assert sum(s.released for s in stats) > 0  # the batch stopped: rows not started went back
    assert "back to pending" not in caplog.text  # nothing was reclaimed from the live worker


def test_a_digest_batch_cut_off_longer_than_the_claim_timeout_sends_nobody_twice(long_outage, relay, settings, caplog):
    """The same for a digest batch: recorded as it goes, stopped when it cannot record, the rest kept
    until Postgres answers; the watchdog leaves the live worker's runs alone."""
    sink, provider = relay
    sink.delay = 0.02
    runs = []
    for i in range(40):
        sid = factories.subscriber(f"u{i}")
        factories.events(f"u{i}", 2)
        runs.append(factories.digest_run(sid))
    long_outage(sink, 5)
    with Scheduler():
        _until(
            lambda: digest_send.process(runs, provider=provider),
            lambda: {run_row(r)["status"] for r in runs} == {"sent"},
        )
    delivered = [m["Message-ID"] for m in sink.messages()]
    assert len(delivered) == 40 and len(set(delivered)) == 40  # one copy each
    assert "no further mail of the batch is started" in caplog.text  # the outage hit a flush
    # nothing was taken back from the live worker (a watchdog tick that failed while Postgres was
    # away logs its failure, and reclaims nothing)
    assert "stuck runs back to pending" not in caplog.text
