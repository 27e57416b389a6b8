"""An outcome the provider accepted is kept and written once Postgres answers again — never thrown
away and sent a second time (Postgres restarting between the send and the commit)."""

from __future__ import annotations

import threading

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
