"""GET /metrics: credentials, and the numbers moving when events, digests, newsletters, webhook
events and clicks/opens go through the real code paths (real Postgres, Redis, SMTP sink, fake SendGrid)."""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playhouse.pool import MaxConnectionsExceeded
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from app.cli import scheduler
from app.newsletter import sender, service
from app.platform import apikeys, config, db, metrics
from digest import plan as digest_plan
from digest import runs as digest_runs
from digest import send as digest_send
from tests import factories
from tests.conftest import auth, wait_for
from tests.digest_support import SmtpSink, free_port, sink_as_provider
from tests.newsletter.test_workers import start_worker, stop_worker
from tests.newsletter_support import counts, drain, start
from tests.tracking.test_routes import UA_HUMAN, click_path, sent_newsletter
from tests.tracking.test_webhook_apply import store
from tracking import codes, recorder, resolve, webhook_apply

ROOT = Path(__file__).resolve().parents[2]
DEAD_PID = 2**22 + 12345  # above any pid_max: never alive


@pytest.fixture(autouse=True)
def _no_dead_processes():
    """What every process of a deployment does when it starts: the live gauges of processes that are
    gone (workers other tests started and killed) no longer count, so these tests see only their own."""
    metrics.setup()


def scrape(client, key: str) -> dict:
    response = client.get("/metrics", headers=auth(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(sample: dict, name: str, **labels) -> float:
    return sample.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings, smtp_pool_size=2) as s:
        yield s


def test_metrics_need_an_admin_key_or_the_metrics_token(client, settings, admin_key, events_key):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth("not-a-key")).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Basic abc"}).status_code == 401
    assert client.get("/metrics", headers=auth(events_key)).status_code == 403
    assert client.get("/metrics", headers=auth(admin_key)).status_code == 200
    apikeys.revoke("admin-test")
    assert client.get("/metrics", headers=auth(admin_key)).status_code == 401
    assert client.get("/metrics", headers=auth("")).status_code == 401  # unset token matches nothing
    settings(metrics_token="s3cret-scrape-token")
    assert client.get("/metrics", headers=auth("s3cret-scrape-token")).status_code == 200
    assert client.get("/metrics", headers=auth("s3cret-scrape-token-x")).status_code == 401


def test_events_accepted_duplicate_rejected(client, admin_key, events_key):
    before = scrape(client, admin_key)
    event = {"id": "e1", "user_id": "u1", "category": "like", "entity_type": "post", "entity_id": "p1"}
    assert (
        client.post("/v1/events", json={"events": [event, {**event, "id": "e2"}]}, headers=auth(events_key)).status_code
        == 202
    )
    assert client.post("/v1/events", json=event, headers=auth(events_key)).status_code == 202  # duplicate
    assert (
        client.post(
            "/v1/events", json={"events": [{**event, "id": "e3"}, {"id": "bad"}]}, headers=auth(events_key)
        ).status_code
        == 422
    )
    after = scrape(client, admin_key)
    for result, n in {"accepted": 2, "duplicate": 1, "rejected": 2}.items():
        assert (
            value(after, "notify_events_total", result=result) - value(before, "notify_events_total", result=result)
            == n
        ), result


def test_digest_send_counts_runs_lateness_and_provider_calls(client, admin_key, sink, redis_client):
    sid = factories.subscriber("u1")
    factories.events("u1", 2)
    late = factories.digest_run(sid, scheduled_for=datetime.now(UTC) - timedelta(minutes=10))
    empty = factories.digest_run(factories.subscriber("u2"))
    before = scrape(client, admin_key)
    assert value(before, "notify_digest_oldest_due_seconds") >= 600
    assert value(before, "notify_digest_runs_due") == 2
    assert value(before, "notify_scrape_source_up", source="postgres") == 1
    assert value(before, "notify_scrape_source_up", source="redis") == 1
    assert value(before, "notify_queue_depth", queue="digest") == 0

    assert digest_send.process([late, empty]) == {"sent": 1, "skipped": 1, "retry": 0, "failed": 0}

    after = scrape(client, admin_key)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert value(delta, "notify_digest_runs_total", state="sent") == 1
    assert value(delta, "notify_digest_runs_total", state="skipped") == 1
    assert value(delta, "notify_digest_lateness_seconds_count") == 1
    assert 600 <= value(delta, "notify_digest_lateness_seconds_sum") < 700
    assert value(delta, "notify_digest_lateness_seconds_bucket", le="300.0") == 0
    assert value(delta, "notify_digest_lateness_seconds_bucket", le="1800.0") == 1
    assert value(delta, "notify_provider_calls_total", provider="smtp", result="ok") == 1
    assert value(delta, "notify_provider_call_seconds_count", provider="smtp") == 1
    assert value(after, "notify_provider_calls_in_flight", provider="smtp") == 0
    assert value(after, "notify_digest_oldest_due_seconds") == 0 and value(after, "notify_digest_runs_due") == 0


def test_watchdog_and_crash_release_count_the_runs_they_take_back(client, admin_key, settings, monkeypatch):
    """Runs taken back outside a worker's batch are counted once their transition is committed:
    back to pending as `retry`, attempts used up as `failed`; a rolled-back take-back is not."""
    settings(digest_processing_timeout_seconds=600, digest_max_attempts=3)
    now = datetime.now(UTC)
    old = now - timedelta(minutes=11)
    stuck = factories.digest_run(factories.subscriber("a"), status="processing", claimed_at=old)
    factories.digest_run(factories.subscriber("b"), status="processing", claimed_at=old, attempts=2)
    before = scrape(client, admin_key)
    assert digest_plan.watchdog(now) == (1, 1)
    after = scrape(client, admin_key)
    for state in ("retry", "failed"):
        assert (
            value(after, "notify_digest_runs_total", state=state)
            - value(before, "notify_digest_runs_total", state=state)
            == 1
        ), state

    db.query("UPDATE digest_runs SET status = 'processing', claimed_at = %s WHERE id = %s", (old, stuck))
    reclaim = digest_runs.reclaim_stuck

    def reclaim_then_fail(cur, *args, **kwargs):
        reclaim(cur, *args, **kwargs)
        raise RuntimeError("the commit never happens")

    monkeypatch.setattr(digest_runs, "reclaim_stuck", reclaim_then_fail)
    with pytest.raises(RuntimeError):
        digest_plan.watchdog(now)
    assert db.query("SELECT status FROM digest_runs WHERE id = %s", (stuck,))[0][0] == "processing"
    unchanged = scrape(client, admin_key)
    for state in ("retry", "failed"):
        assert value(unchanged, "notify_digest_runs_total", state=state) == value(
            after, "notify_digest_runs_total", state=state
        ), state

    digest_send._release_after_crash([stuck])  # a batch that crashed gives its runs back
    released = scrape(client, admin_key)
    assert (
        value(released, "notify_digest_runs_total", state="retry")
        - value(after, "notify_digest_runs_total", state="retry")
        == 1
    )


def test_newsletter_send_counts_recipients_and_provider_calls(client, admin_key, fake, provider, settings):
    settings(send_batch_size=10)
    factories.seed_subscribers(25)
    nl = factories.newsletter()
    start(nl)
    factories.suppression("user3@example.com", "bounce")  # after the outbox: caught at claim time
    before = scrape(client, admin_key)
    drain(nl, provider)
    assert counts(nl) == {"sent": 24, "suppressed": 1}
    after = scrape(client, admin_key)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert value(delta, "notify_newsletter_recipients_total", state="sent") == 24
    assert value(delta, "notify_newsletter_recipients_total", state="suppressed") == 1
    assert value(delta, "notify_provider_calls_total", provider="sendgrid", result="ok") == fake.calls == 3


def test_recipients_of_newsletters_being_sent_by_state(client, admin_key):
    """Scrape-time gauge: email_log rows of the newsletters in `sending`, by the statuses their
    partial indexes cover; a finished newsletter's rows are not counted."""
    now = datetime.now(UTC)
    factories.seed_subscribers(9)
    done = factories.newsletter_row(status="done", send_requested_at=now - timedelta(days=2))
    for sid in range(1, 10):
        factories.outbox_row(done, sid, status="sent", sent_at=now - timedelta(days=2))
    assert {
        value(scrape(client, admin_key), "notify_newsletter_sending_recipients", state=state)
        for state in metrics.NEWSLETTER_STATES
    } == {0}
    for started in (timedelta(hours=1), timedelta(minutes=5)):
        nl = factories.newsletter_row(status="sending", send_requested_at=now - started)
        for sid, status in zip(range(1, 10), ["sent"] * 4 + ["pending"] * 2 + ["sending", "failed", "suppressed"]):
            factories.outbox_row(
                nl,
                sid,
                status=status,
                sent_at=now if status == "sent" else None,
                claimed_at=now if status == "sending" else None,
            )
    sample = scrape(client, admin_key)
    assert {
        state: value(sample, "notify_newsletter_sending_recipients", state=state) for state in metrics.NEWSLETTER_STATES
    } == {"pending": 4, "sending": 2, "sent": 8}


def test_newsletter_provider_failures_count_as_retries(client, admin_key, fake, provider):
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)
    before = scrape(client, admin_key)
    fake.fail_next(1, status=500)
    stats = sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=60)
    after = scrape(client, admin_key)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert value(delta, "notify_newsletter_recipients_total", state="retry") == stats.retry == 3
    assert value(delta, "notify_provider_calls_total", provider="sendgrid", result="transient") == 1


def test_webhook_events_by_type(client, admin_key):
    ids = store(
        {"event": "delivered", "email": "a@example.com"},
        {"event": "open", "email": "a@example.com"},
        {"event": "open", "email": "b@example.com"},
        {"event": "made-up", "email": "b@example.com"},
    )
    before = scrape(client, admin_key)
    assert value(before, "notify_webhook_events_unapplied") == 4
    assert webhook_apply.apply_events(ids) == 4
    after = scrape(client, admin_key)
    for kind, n in {"delivered": 1, "open": 2, "other": 1}.items():
        assert (
            value(after, "notify_webhook_events_total", type=kind)
            - value(before, "notify_webhook_events_total", type=kind)
            == n
        ), kind
    assert value(after, "notify_webhook_events_unapplied") == 0


def test_opens_human_and_machine(client, admin_key):
    code = codes.open_code("newsletter", 1, 1)
    before = scrape(client, admin_key)
    browser = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/120 Safari/537.36"
    assert client.get(f"/o/{code}.gif", headers={"User-Agent": browser}).status_code == 200
    assert client.head(f"/o/{code}.gif", headers={"User-Agent": browser}).status_code == 200  # HEAD: machine
    after = scrape(client, admin_key)
    for who in ("human", "machine"):
        assert (
            value(after, "notify_tracking_hits_total", kind="open", who=who)
            - value(before, "notify_tracking_hits_total", kind="open", who=who)
            == 1
        ), who


def test_clicks_human_and_machine(client, admin_key, settings):
    settings(tracking=True)
    resolve.clear_caches()
    nl_id, sub_id = sent_newsletter()
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/page")
    before = scrape(client, admin_key)
    try:
        assert client.get(path, headers={"User-Agent": UA_HUMAN}, follow_redirects=False).status_code == 302
        assert client.head(path, headers={"User-Agent": UA_HUMAN}, follow_redirects=False).status_code == 302
        assert client.get(path, headers={"User-Agent": ""}, follow_redirects=False).status_code == 302  # no agent
    finally:
        recorder.recorder().flush()
        resolve.clear_caches()
    after = scrape(client, admin_key)
    for who, n in {"human": 1, "machine": 2}.items():
        assert (
            value(after, "notify_tracking_hits_total", kind="click", who=who)
            - value(before, "notify_tracking_hits_total", kind="click", who=who)
            == n
        ), who


def test_setup_clears_live_gauges_of_dead_processes_only(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "DIRECTORY", tmp_path)
    dead, alive = DEAD_PID, os.getpid()
    for name in (f"gauge_livesum_{dead}.db", f"counter_{dead}.db", f"gauge_livesum_{alive}.db"):
        written = MmapedDict(str(tmp_path / name))  # readable files: an empty one is unreadable
        written.write_value(mmap_key("notify_x", "notify_x", [], [], "h"), 1.0, 0.0)
        written.close()
    metrics.setup()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{dead}.db", f"gauge_livesum_{alive}.db"]


def unreadable_contents(scratch: Path) -> dict[str, bytes]:
    """Multiprocess files as a process killed while creating one leaves them (empty, or cut inside the
    header), and as damage leaves them: a header claiming more bytes than the file has, bytes that
    were never a metrics file, an entry whose key is not JSON. Each name has its own dead pid."""
    whole = MmapedDict(str(scratch / "whole.db"))
    whole.write_value(mmap_key("notify_events", "notify_events_total", ["result"], ["accepted"], "h"), 1.0, 0.0)
    whole.close()
    data = (scratch / "whole.db").read_bytes()
    used = struct.unpack_from("i", data)[0]
    key = b"not json"
    entry = struct.pack(f"i{len(key) + 4}sdd", len(key), key + b"    ", 1.0, 0.0)  # as MmapedDict pads it
    not_json = struct.pack("ii", 8 + len(entry), 0) + entry
    return {
        f"counter_{DEAD_PID}.db": b"",
        f"counter_{DEAD_PID + 1}.db": data[:2],
        f"counter_{DEAD_PID + 2}.db": data[: used - 8],
        f"counter_{DEAD_PID + 3}.db": bytes(range(256)) * 4,
        f"histogram_{DEAD_PID + 4}.db": not_json,
    }


@pytest.fixture
def unreadable(tmp_path):
    """Writes the unreadable files into a directory (the test chooses when); removes them afterwards."""
    written = []

    def write(directory: Path) -> list[Path]:
        for name, content in unreadable_contents(tmp_path).items():
            path = directory / name
            path.write_bytes(content)
            written.append(path)
        return list(written)

    yield write
    for path in written:
        path.unlink(missing_ok=True)


def steady(sample: dict) -> dict:
    """The values a scrape reads from the multiprocess files and that stay put between two scrapes
    (the scrapes themselves check out Postgres connections, and partitions_ahead follows the clock)."""
    moving = ("notify_db_pool_wait_seconds", "notify_partitions_ahead_seconds", "notify_metrics_files_unreadable")
    return {k: v for k, v in sample.items() if not k[0].startswith(moving)}


def test_unreadable_multiprocess_files_are_left_out_and_counted(client, admin_key, unreadable, caplog):
    """A file that is empty, cut short or damaged fails neither the scrape nor any other value: it is
    left out, counted in notify_metrics_files_unreadable, and named in one WARNING however often
    Prometheus scrapes. The next process to start removes such files of processes that are gone."""
    metrics.EVENTS.labels("rejected").inc(7)
    before = scrape(client, admin_key)
    assert value(before, "notify_events_total", result="rejected") >= 7
    paths = unreadable(metrics.DIRECTORY)
    with caplog.at_level(logging.WARNING, logger="app.platform.metrics"):
        scrapes = [scrape(client, admin_key) for _ in range(3)]
    for sample in scrapes:  # this session's killed workers may have left some too
        assert (
            value(sample, "notify_metrics_files_unreadable") - value(before, "notify_metrics_files_unreadable")
            == len(paths)
            == 5
        )
        assert steady(sample) == steady(before)
        assert value(sample, "notify_scrape_source_up", source="postgres") == 1
    for path in paths:
        assert [r.levelname for r in caplog.records if str(path) in r.getMessage()] == ["WARNING"], path.name

    metrics.setup()  # what a process of the deployment does when it starts
    assert not any(path.exists() for path in paths)
    after = scrape(client, admin_key)
    assert value(after, "notify_metrics_files_unreadable") == 0
    assert steady(after) == steady(before)


def test_setup_removes_unreadable_files_of_dead_processes_only(tmp_path, monkeypatch, unreadable):
    """A dead process's unreadable file can never be completed (and would break a new process that
    gets its pid); a live process's may be one it is creating right now, and stays."""
    directory = tmp_path / "multiproc"
    directory.mkdir()
    monkeypatch.setattr(metrics, "DIRECTORY", directory)
    unreadable(directory)
    live = os.getppid()
    (directory / f"counter_{live}.db").write_bytes(b"")
    readable = MmapedDict(str(directory / f"histogram_{DEAD_PID}.db"))
    readable.write_value(mmap_key("notify_x", "notify_x_sum", [], [], "h"), 1.0, 0.0)
    readable.close()
    with pytest.raises(struct.error):  # a new process with the cut file's pid would fail so
        MmapedDict(str(directory / f"counter_{DEAD_PID + 1}.db"))
    metrics.setup()
    assert sorted(p.name for p in directory.iterdir()) == [f"counter_{live}.db", f"histogram_{DEAD_PID}.db"]


def test_a_file_met_while_its_process_creates_it_counts_once_complete(client, admin_key):
    """The race behind the flaky end-to-end test, step by step: a scrape meets a process's new file
    before its header is written (left out), and the next scrape reads what that process counted."""
    before = scrape(client, admin_key)
    path = metrics.DIRECTORY / f"counter_{DEAD_PID + 9}.db"
    path.write_bytes(b"")  # MmapedDict has created the file and not sized it yet
    unreadable_now = scrape(client, admin_key)
    assert (
        value(unreadable_now, "notify_metrics_files_unreadable") - value(before, "notify_metrics_files_unreadable") == 1
    )
    assert steady(unreadable_now) == steady(before)
    try:
        created = MmapedDict(str(path))  # ... and now has
        created.write_value(
            mmap_key("notify_events", "notify_events_total", ["result"], ["accepted"], metrics.EVENTS._documentation),
            4.0,
            0.0,
        )
        created.close()
        after = scrape(client, admin_key)
    finally:
        path.unlink()
    assert value(after, "notify_metrics_files_unreadable") == value(before, "notify_metrics_files_unreadable")
    assert (
        value(after, "notify_events_total", result="accepted") - value(before, "notify_events_total", result="accepted")
        == 4
    )


def test_values_of_other_processes_are_summed(client, admin_key):
    """Multiprocess mode: what a worker process counted shows in the web process's scrape, also
    after that process has exited."""
    before = scrape(client, admin_key)
    subprocess.run(
        [sys.executable, "-c", "from app.platform import metrics; metrics.EVENTS.labels('duplicate').inc(5)"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "APP_ENV": "test"},
    )
    after = scrape(client, admin_key)
    assert (
        value(after, "notify_events_total", result="duplicate")
        - value(before, "notify_events_total", result="duplicate")
        == 5
    )


@pytest.fixture
def exporter():
    """`python -m app metrics-exporter` as a worker-only host runs it, on a free port, with this
    run's PROMETHEUS_MULTIPROC_DIR (the environment it inherits)."""
    port = free_port()
    env = {**os.environ, "APP_ENV": "test", "METRICS_TOKEN": "exporter-token"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "metrics-exporter", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def answering():
        assert proc.poll() is None, proc.stderr.read()
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            return None

    wait_for(answering, timeout=30, what="the metrics exporter")
    yield url
    proc.terminate()
    assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its clean shutdown


def test_metrics_exporter_serves_this_hosts_values_with_the_same_credentials(exporter, admin_key, events_key):
    metrics.EVENTS.labels("duplicate").inc(3)  # as a worker process of this host would
    assert httpx.get(exporter).status_code == 401
    assert httpx.get(exporter, headers=auth(events_key)).status_code == 403
    assert httpx.get(exporter, headers=auth("exporter-token-x")).status_code == 401
    response = httpx.get(exporter, headers=auth("exporter-token"))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    response = httpx.get(exporter, headers=auth(admin_key))
    assert response.status_code == 200
    sample = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert value(sample, "notify_events_total", result="duplicate") >= 3
    assert value(sample, "notify_scrape_source_up", source="postgres") == 1
    assert httpx.get(exporter.replace("/metrics", "/healthz")).status_code == 404  # /metrics alone


def test_metrics_exporter_leaves_out_unreadable_files(exporter, unreadable):
    metrics.EVENTS.labels("duplicate").inc(2)
    paths = unreadable(metrics.DIRECTORY)  # after the exporter's start-up, which would remove them
    response = httpx.get(exporter, headers=auth("exporter-token"))
    assert response.status_code == 200, response.text
    sample = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert value(sample, "notify_metrics_files_unreadable") == len(paths)
    assert value(sample, "notify_events_total", result="duplicate") >= 2


@pytest.mark.slow
def test_a_real_worker_process_counts_into_the_web_scrape(client, admin_key, redis_client):
    """Multiprocess mode end to end: a `dramatiq actors` subprocess sharing this run's
    PROMETHEUS_MULTIPROC_DIR sends digests and a newsletter to an SMTP sink; the web app's scrape
    shows what that process counted, while it runs and after it has exited."""
    sink = SmtpSink().start()
    for i in range(3):
        factories.events(f"u{i}", 2)
        factories.digest_run(factories.subscriber(f"u{i}"), scheduled_for=datetime.now(UTC) - timedelta(minutes=10))
    factories.seed_subscribers(12, start=10)
    nl = factories.newsletter()
    own_sent = metrics.DIGEST_RUNS.labels("sent")._value.get()  # this process's own file
    before = scrape(client, admin_key)
    worker = start_worker(
        "http://unused.invalid",
        MAIL_PROVIDER="smtp",
        SMTP_URL=sink.url,
        TRACKING="0",
        PROMETHEUS_MULTIPROC_DIR=str(metrics.DIRECTORY),
        queues=("digest", "newsletter"),
    )
    try:
        assert scheduler.tick(datetime.now(UTC))["enqueued"] == 3  # Redis → the worker
        service.request_send(nl, {"kind": "all"})

        def moved():
            delta = {k: v - before.get(k, 0.0) for k, v in scrape(client, admin_key).items()}
            done = (
                value(delta, "notify_digest_runs_total", state="sent") == 3
                and value(delta, "notify_newsletter_recipients_total", state="sent") == 15
            )
            return done and delta

        delta = wait_for(moved, what="the worker's counters in the web scrape")
    finally:
        stop_worker(worker)
        sink.stop()
    assert len(sink.messages()) == 3 + 15
    assert value(delta, "notify_digest_lateness_seconds_count") == 3
    assert value(delta, "notify_digest_lateness_seconds_sum") >= 3 * 600
    calls = value(delta, "notify_provider_calls_total", provider="smtp", result="ok")
    assert calls >= 2 and value(delta, "notify_provider_call_seconds_count", provider="smtp") == calls
    assert metrics.DIGEST_RUNS.labels("sent")._value.get() == own_sent  # none of it counted here
    after_exit = scrape(client, admin_key)
    assert (
        value(after_exit, "notify_digest_runs_total", state="sent")
        - value(before, "notify_digest_runs_total", state="sent")
        == 3
    )  # a dead process's counters stay
    assert value(after_exit, "notify_provider_calls_in_flight", provider="smtp") == 0


def test_db_pool_waits_and_timeouts(client, admin_key):
    """A pool of one connection held by another thread: a check-out that gives up is counted as a
    timeout, one that waits for the release shows in the wait histogram."""
    pool = db.Pool(None)
    pool.init(config.get().database_url, max_connections=1, timeout=0.3, stale_timeout=300)
    held, release = threading.Event(), threading.Event()

    def hold():
        pool.connect()
        held.set()
        release.wait(10)
        pool.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    before = scrape(client, admin_key)
    try:
        with pytest.raises(MaxConnectionsExceeded):
            pool.connect()
        threading.Timer(0.2, release.set).start()
        assert pool.connect() is True
        pool.close()
    finally:
        release.set()
        holder.join(10)
        pool.close_all()
    after = scrape(client, admin_key)

    def slow(sample):  # check-outs that took longer than 0.1 s
        return value(sample, "notify_db_pool_wait_seconds_count") - value(
            sample, "notify_db_pool_wait_seconds_bucket", le="0.1"
        )

    assert value(after, "notify_db_pool_timeouts_total") == value(before, "notify_db_pool_timeouts_total") + 1
    assert slow(after) - slow(before) >= 2
    assert value(after, "notify_db_pool_wait_seconds_sum") - value(before, "notify_db_pool_wait_seconds_sum") >= 0.45


def test_queue_depth_and_processing_runs_move(client, admin_key, redis_client):
    """What the checker enqueues shows as queue depth until a worker takes it; a claimed run shows as
    processing until its batch is recorded."""
    sid = factories.subscriber("u1")
    factories.events("u1", 1)
    run = factories.digest_run(sid, scheduled_for=datetime.now(UTC) - timedelta(minutes=1))
    before = scrape(client, admin_key)
    assert scheduler.tick(datetime.now(UTC))["enqueued"] == 1  # Redis, no worker running
    queued = scrape(client, admin_key)
    assert (
        value(queued, "notify_queue_depth", queue="digest") - value(before, "notify_queue_depth", queue="digest") == 1
    )
    with db.raw_cursor() as cur:
        digest_runs.claim(cur, [run], 1)  # a worker's claim, committed
    assert value(scrape(client, admin_key), "notify_digest_runs_processing") == 1
