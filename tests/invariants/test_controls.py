"""Controls that hold (I9): pause, cancel and the emergency stop take effect within a second of
their answer, whatever the claim size and however slow the relay; nothing is lost or sent twice
when they are released, and a worker killed mid-batch re-sends only what it had not yet recorded.

Real Postgres and Redis, and a real SMTP relay (a local sink answering each mail after 20 ms). The
send chains run as the actor runs them, in threads of this process (tests call the worker code
path directly); the crash test runs one in a process of its own and kills it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app import cli
from app.newsletter import outbox, reclaim, sender, service
from app.platform import config, db, metrics, providers
from digest import send as digest_send
from tests import factories
from tests.conftest import auth, wait_for
from tests.digest_support import SmtpSink
from tests.newsletter_support import counts, start
from tests.web.test_admin_routes import csrf_of, sign_in

ROOT = Path(__file__).resolve().parents[2]
RELAY_DELAY = 0.02  # seconds a mail takes at the relay
LANES = 4  # SMTP connections: 200 mails/s, so a send of 1,500 takes 7 s
RECIPIENTS = 1500
CONTROL_BOUND = 1.0  # what the issue asks: no mail starts later than this after the answer


@pytest.fixture
def slow_relay(settings, redis_client):
    sink = SmtpSink().start()
    sink.delay = RELAY_DELAY
    settings(
        mail_provider="smtp",
        smtp_url=sink.url,
        smtp_pool_size=LANES,
        smtp_pool_max=LANES,
        send_batch_size=1000,
        tracking=False,
    )
    try:
        yield sink
    finally:
        providers.close_all()
        sink.stop()


class Chains:
    """`n` send chains of one newsletter, each calling the send loop again for as long as the
    actor would re-enqueue itself."""

    def __init__(self, newsletter_id: int, n: int = 4):
        self.newsletter_id = newsletter_id
        self.threads = [threading.Thread(target=self._chain, daemon=True) for _ in range(n)]
        self.outcomes: list[str] = []

    def _chain(self) -> None:
        while True:
            stats = sender.send_batch(self.newsletter_id, reenqueue=False, budget_seconds=5)
            self.outcomes.append((stats.claimed, stats.sent, stats.released, stats.outcome))
            if stats.retry_in is None:
                return
            time.sleep(stats.retry_in)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.threads:
            t.join(120)
        assert not any(t.is_alive() for t in self.threads), "a send chain did not stop"


def started_after(sink: SmtpSink, moment: float) -> list[float]:
    return [t - moment for t in sink.data_at if t > moment + CONTROL_BOUND]


def recipients(sink: SmtpSink) -> Counter:
    return Counter(to for _, tos in sink.envelopes for to in tos)


def message_ids(sink: SmtpSink) -> Counter:
    return Counter(re.search(rb"^Message-ID: *(\S+)", raw, re.M | re.I).group(1) for raw in list(sink.raw))


def row_attempts(newsletter_id: int) -> dict:
    return dict(
        db.query(
            "SELECT status, max(attempts) FROM email_log WHERE newsletter_id = %s GROUP BY status", (newsletter_id,)
        )
    )


def _sending_newsletter(n: int = RECIPIENTS) -> int:
    factories.seed_subscribers(n)
    newsletter_id = factories.newsletter()
    start(newsletter_id)
    return newsletter_id


def test_pause_stops_every_chain_within_a_second_and_resume_sends_the_rest_once(slow_relay, client, admin_key):
    nl = _sending_newsletter()
    with Chains(nl) as chains:
        wait_for(lambda: len(slow_relay.raw) >= 100, 60, "the first 100 mails")
        assert client.post(f"/v1/newsletters/{nl}/pause", headers=auth(admin_key)).status_code == 200
        answered = time.monotonic()
    print(chains.outcomes)
    assert started_after(slow_relay, answered) == []
    sent = len(slow_relay.raw)
    assert sent < RECIPIENTS / 2  # 1,000 rows were claimed: most went back
    assert counts(nl) == {"sent": sent, "pending": RECIPIENTS - sent}
    assert row_attempts(nl)["pending"] <= 0  # the claim's attempt was refunded
    assert client.post(f"/v1/newsletters/{nl}/resume", headers=auth(admin_key)).status_code == 200
    with Chains(nl):
        pass
    assert counts(nl) == {"sent": RECIPIENTS}
    got = recipients(slow_relay)
    assert len(got) == RECIPIENTS and set(got.values()) == {1}  # every recipient exactly once


def test_cancel_stops_every_chain_within_a_second_and_cancels_what_was_claimed(slow_relay, client, admin_key):
    nl = _sending_newsletter()
    with Chains(nl):
        wait_for(lambda: len(slow_relay.raw) >= 100, 60, "the first 100 mails")
        answer = client.post(f"/v1/newsletters/{nl}/cancel", headers=auth(admin_key))
        assert answer.status_code == 200
        answered = time.monotonic()
    assert started_after(slow_relay, answered) == []
    sent = len(slow_relay.raw)
    assert counts(nl) == {"sent": sent, "cancelled": RECIPIENTS - sent}
    assert set(recipients(slow_relay).values()) == {1}
    status = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()
    assert status["status"] == "cancelled" and status["counts"]["sent"] == sent


def _due_digests(n: int) -> list[int]:
    runs = []
    for i in range(n):
        sid = factories.subscriber(f"d{i}")
        factories.events(f"d{i}", 2)
        runs.append(factories.digest_run(sid))
    return runs


def _digest_statuses(runs) -> dict:
    return dict(db.query("SELECT status, count(*) FROM digest_runs WHERE id = ANY (%s) GROUP BY status", (runs,)))


def _scrape(client, admin_key) -> str:
    return client.get("/metrics", headers=auth(admin_key)).text


def test_emergency_stop_holds_digests_and_newsletters_within_a_second_and_loses_nothing(
    slow_relay, client, admin_key, settings, capsys
):
    settings(digest_claim_batch=300)
    runs = _due_digests(300)
    nl = _sending_newsletter(600)  # to all 900 subscribers
    digests = threading.Thread(target=digest_send.process, kwargs={"run_ids": runs}, daemon=True)
    with Chains(nl, n=2):
        digests.start()
        wait_for(lambda: len(slow_relay.raw) >= 100, 60, "the first 100 mails")
        assert cli.main(["stop-sending", "--reason", "ESP suspended the account"]) == 0
        answered = time.monotonic()
        digests.join(60)
    assert started_after(slow_relay, answered) == []
    assert "ESP suspended the account" in capsys.readouterr().out

    # Nothing was lost: what did not go out is waiting, untried.
    statuses = _digest_statuses(runs)
    assert set(statuses) <= {"sent", "pending"} and statuses.get("pending", 0) > 0
    assert db.query("SELECT max(attempts) FROM digest_runs WHERE status = 'pending'")[0][0] == 0
    assert set(counts(nl)) <= {"sent", "pending"} and counts(nl).get("pending", 0) > 0

    # While it holds: nothing is claimed or sent, test sends are refused, and it is visible.
    before = len(slow_relay.raw)
    assert digest_send.process(run_ids=runs) == {"sent": 0, "skipped": 0, "retry": 0, "failed": 0}
    assert "all mail is stopped" in sender.send_batch(nl, reenqueue=False).outcome
    refused = client.post(f"/v1/newsletters/{nl}/test", headers=auth(admin_key), json={"to": ["x@example.com"]})
    assert refused.status_code == 409 and refused.json()["error"] == "sending_stopped"
    assert len(slow_relay.raw) == before
    assert re.search(r"^notify_mail_stopped 1\.0$", _scrape(client, admin_key), re.M)
    assert sign_in(client, admin_key).status_code == 303
    page = client.get("/admin").text
    assert "All outgoing mail is stopped" in page and "ESP suspended the account" in page

    # Released from the dashboard: everything goes, each exactly once.
    resumed = client.post("/admin/sending/resume", data={"csrf_token": csrf_of(page)}, follow_redirects=False)
    assert (resumed.status_code, resumed.headers["location"]) == (303, "/admin?notice=resumed")
    assert re.search(r"^notify_mail_stopped 0\.0$", _scrape(client, admin_key), re.M)
    assert digest_send.process(run_ids=runs)["sent"] == statuses["pending"]
    with Chains(nl, n=2):
        pass
    assert _digest_statuses(runs) == {"sent": 300} and counts(nl) == {"sent": 900}
    sent = message_ids(slow_relay)
    assert len(sent) == 1200 and set(sent.values()) == {1}  # each digest and newsletter mail once
    # The stop came from the CLI (audited under the login name, no API key), the release from the dashboard.
    audit = db.query("SELECT action, api_key_id IS NULL, api_key_name LIKE 'cli%%' FROM admin_audit ORDER BY id")
    assert audit == [("mail_stop.engage", True, True), ("mail_stop.release", False, False)]


def test_the_dashboard_button_stops_all_mail_with_a_reason_and_is_audited(client, admin_key):
    assert sign_in(client, admin_key).status_code == 303
    page = client.get("/admin").text
    assert "Stop all sending" in page
    no_reason = client.post("/admin/sending/stop", data={"csrf_token": csrf_of(page), "reason": " "})
    assert no_reason.status_code == 422 and not db.query("SELECT 1 FROM mail_stop")
    forged = client.post("/admin/sending/stop", data={"csrf_token": "forged", "reason": "x"})
    assert forged.status_code == 403 and not db.query("SELECT 1 FROM mail_stop")
    stopped = client.post(
        "/admin/sending/stop", data={"csrf_token": csrf_of(page), "reason": "broken template"}, follow_redirects=False
    )
    assert (stopped.status_code, stopped.headers["location"]) == (303, "/admin?notice=stopped")
    assert db.query("SELECT engaged_by, reason FROM mail_stop") == [("admin:admin-test", "broken template")]
    page = client.get("/admin?notice=stopped").text
    assert "Resume sending" in page and "broken template" in page
    audit = db.query("SELECT action, api_key_name, detail->>'reason' FROM admin_audit")
    assert audit == [("mail_stop.engage", "admin-test", "broken template")]
    assert cli.main(["resume-sending"]) == 0 and not db.query("SELECT 1 FROM mail_stop")
    released = db.query("SELECT action, api_key_id, detail->>'was_stopped' FROM admin_audit ORDER BY id DESC LIMIT 1")
    assert released == [("mail_stop.release", None, "true")]


CRASH_SCRIPT = textwrap.dedent("""
    import sys
    from app.platform import db
    from app.newsletter import sender
    db.init()
    sender.send_batch(int(sys.argv[1]), reenqueue=False, budget_seconds=600)
""")


@pytest.mark.slow
def test_a_worker_killed_mid_batch_resends_at_most_what_it_had_not_recorded(slow_relay, settings):
    """Today's bound was the whole claim (a kill -9 re-sent 768 of 1,000); now what the provider
    accepted is recorded every sender.FLUSH_EVERY mails or SEND_CHECK_SECONDS."""
    nl = _sending_newsletter(1000)
    env = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": config.get().database_url,
        "REDIS_URL": config.get().redis_url,
        "MAIL_PROVIDER": "smtp",
        "SMTP_URL": slow_relay.url,
        "SMTP_POOL_SIZE": str(LANES),
        "SMTP_POOL_MAX": str(LANES),
        "SEND_BATCH_SIZE": "1000",
        "TRACKING": "0",
        "PYTHONPATH": str(ROOT),
    }
    # Past 450 mails the relay takes each mail and never answers: every lane ends with one mail
    # delivered that the worker cannot have recorded, whenever the kill lands against its flushes.
    slow_relay.hold_after = 450
    worker = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(nl)], env=env, cwd=ROOT)
    try:
        wait_for(lambda: len(slow_relay.raw) >= 450 + LANES, 60, "450 mails and one held on each lane")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        metrics.setup()  # as the next process of the deployment would: the dead worker's live gauges go
        slow_relay.release()
    delivered = len(slow_relay.raw)
    recorded = counts(nl).get("sent", 0)
    assert 0 < delivered - recorded <= sender.FLUSH_EVERY + LANES + 10, (delivered, recorded)
    held = counts(nl)["sending"]  # the dead worker's claim, until the reclaimer
    settings(reclaim_after_seconds=0)
    assert reclaim.reclaim_stale()["reclaimed_rows"] == held > 0
    with Chains(nl, n=1):
        pass
    assert counts(nl) == {"sent": 1000}
    resent = sum(n - 1 for n in recipients(slow_relay).values())
    assert resent == delivered - recorded  # only the unrecorded ones went twice (same Message-ID)


def test_a_partly_due_local_time_newsletter_pauses_and_cancels_within_a_second(slow_relay, client, admin_key):
    """A local_time send (tests/newsletter/test_schedule.py): the UTC half of the recipients is due,
    the Tokyo half only in hours. Pause holds within a second; cancel cancels the rows not yet due."""
    factories.seed_subscribers(RECIPIENTS)
    db.query("UPDATE subscribers SET timezone = CASE WHEN mod(id, 2) = 0 THEN 'Asia/Tokyo' ELSE 'UTC' END")
    nl = factories.newsletter()
    at = (datetime.now(UTC) - timedelta(hours=6)).time().replace(second=0, microsecond=0)
    service.request_send(nl, {"kind": "all"}, local_time=at)  # due at `at` UTC; in Tokyo 9 h from now
    db.query("UPDATE newsletters SET send_requested_at = now() - interval '12 hours' WHERE id = %s", (nl,))
    outbox.create_outbox(nl)
    due = RECIPIENTS // 2
    with Chains(nl):
        wait_for(lambda: len(slow_relay.raw) >= 100, 60, "the first 100 mails")
        assert client.post(f"/v1/newsletters/{nl}/pause", headers=auth(admin_key)).status_code == 200
        answered = time.monotonic()
    assert started_after(slow_relay, answered) == []
    sent = len(slow_relay.raw)
    assert sent < due and counts(nl) == {"sent": sent, "pending": RECIPIENTS - sent}
    assert client.post(f"/v1/newsletters/{nl}/resume", headers=auth(admin_key)).status_code == 200
    with Chains(nl) as chains:
        pass
    # each of the 4 chains ended leaving the rows not yet due to the tick
    assert sum(outcome.endswith("the scheduler tick re-kicks") for *_, outcome in chains.outcomes) == 4
    assert counts(nl) == {"sent": due, "pending": RECIPIENTS - due}
    answer = client.post(f"/v1/newsletters/{nl}/cancel", headers=auth(admin_key)).json()
    assert answer == {"id": nl, "status": "cancelled", "cancelled_rows": RECIPIENTS - due}
    assert counts(nl) == {"sent": due, "cancelled": RECIPIENTS - due}
    got = recipients(slow_relay)
    assert len(got) == due and set(got.values()) == {1}
    assert all(int(to.split("@")[0].removeprefix("user")) % 2 == 1 for to in got)  # the UTC half only
