"""The digest actor's code path against real Postgres, Redis and a local SMTP server (aiosmtpd)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from app.platform import config, db, providers
from app.subscribers import records as subscribers
from digest import build as digest_build
from digest import marks as digest_marks
from digest import plan as digest_plan
from digest import send as digest_send
from tests import factories
from tests.digest_support import marked, run_row, sink_as_provider

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def test_sends_one_digest_and_marks_exactly_its_events(sink):
    sid = factories.subscriber("u1", name="Ana Lima")
    ids = factories.events("u1", 3, entity_id="p1") + factories.events("u1", 2, entity_id="p2", category="comment")
    other = factories.events("someone-else", 2)
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    row = run_row(rid)
    assert row["status"] == "sent" and row["event_count"] == 5 and row["completed_at"] is not None
    assert set(marked(ids).values()) == {rid} and set(marked(other).values()) == {None}
    (msg,) = sink.messages()
    assert msg["To"] == "Ana Lima <u1@example.test>"
    assert msg["Message-ID"].startswith(f"<digest-run-{rid}.")
    assert row["provider_message_id"] == msg["Message-ID"].strip("<>")
    assert msg["List-Unsubscribe"].startswith("<http") and "/u/" in msg["List-Unsubscribe"]
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    html = msg.get_body(("html",)).get_content()
    text = msg.get_body(("plain",)).get_content()
    assert "/u/" in html and "/preferences/" in html and "Unsubscribe" in html
    # one block per entity, one line per category: its actors, most recent first
    assert "* Post p1\n  - Like from Actor a2, Actor a1 and Actor a0 (" in text.replace("\r\n", "\n")
    assert "* Post p2\n  - Comment from Actor a1 and Actor a0 (" in text.replace("\r\n", "\n")
    assert "Your first digest: 5 updates." in text
    # a second call (redelivered message) sends nothing
    assert digest_send.process([rid]) == {"sent": 0, "skipped": 0, "retry": 0, "failed": 0}
    assert len(sink.messages()) == 1


def test_skip_when_there_is_nothing_to_send(sink):
    sid = factories.subscriber("u1")
    factories.events("u1", 2, category="promo")
    subscribers.update(sid, {"category_opt_outs": ["promo"]})
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["skipped"] == 1
    row = run_row(rid)
    assert row["status"] == "skipped" and row["skip_reason"] == "no events" and row["event_count"] == 0
    assert sink.messages() == []


def test_opted_out_categories_are_excluded_and_passed_over(sink):
    """An opted-out topic's events are never read into a digest; the digest's mark passes over them,
    so opting back in brings the topic's new events, not a backlog of the old ones."""
    sid = factories.subscriber("u1", category_opt_outs=["promo"])
    keep = factories.events("u1", 2, category="like")
    promo = factories.events("u1", 2, category="promo")
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    assert set(marked(keep).values()) == {rid} and set(marked(promo).values()) == {rid}
    assert run_row(rid)["event_count"] == 2
    assert "promo" not in sink.messages()[0].get_body(("plain",)).get_content()
    factories.subscriber("u1", category_opt_outs=[])
    fresh = factories.events("u1", 1, category="promo", entity_id="p2")
    second = factories.digest_run(sid, period=date.today() + timedelta(days=1))
    digest_send.process([second])
    assert set(marked(fresh).values()) == {second} and run_row(second)["event_count"] == 1


def test_cap_says_and_n_more_and_marks_the_summarised_events(sink, settings):
    settings(digest_max_items=3)
    sid = factories.subscriber("u1")
    ids = []
    for i in range(7):
        ids += factories.events("u1", i + 1, entity_id=f"p{i}", payload={"title": f"Title {i}"})
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    text = sink.messages()[0].get_body(("plain",)).get_content()
    assert "Title 6" in text and "Title 5" in text and "Title 4" in text and "Title 3" not in text
    # counted in updates like the subject and the lead, naming what the 4 left-out entities are
    assert "…and 10 more updates on 4 other posts\n" in text.replace("\r\n", "\n") and "28 updates." in text
    assert set(marked(ids).values()) == {rid} and run_row(rid)["event_count"] == 28


def test_large_backlog_is_paged_and_capped(sink, settings):
    settings(digest_event_page=7, digest_max_events=40)
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 50)
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    states = marked(ids)
    assert [states[i] for i in ids[:40]] == [rid] * 40  # oldest first, up to the cap
    assert [states[i] for i in ids[40:]] == [None] * 10  # the rest waits for the next digest


def test_hostile_actor_names_are_escaped_in_the_sent_mail(sink):
    sid = factories.subscriber("u1")
    factories.events(
        "u1", 2, actor_name='<script>alert("pwn")</script>', payload={"title": "<b>t</b>", "url": "javascript:alert(1)"}
    )
    digest_send.process([factories.digest_run(sid)])
    html = sink.messages()[0].get_body(("html",)).get_content()
    assert "<script>" not in html and "&lt;script&gt;" in html and "javascript:" not in html
    assert "<b>t</b>" not in html


@pytest.mark.parametrize("how", ["unsubscribed", "suppressed", "paused", "cadence"])
def test_suppressed_subscribers_are_skipped_at_claim_time(sink, how):
    sid = factories.subscriber("u1", email="Mixed.Case@Example.test")
    ids = factories.events("u1", 2)
    rid = factories.digest_run(sid)
    # the run was planned while the subscriber was fine; the change lands right before the claim
    if how == "unsubscribed":
        db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id = %s", (sid,))
    elif how == "suppressed":
        factories.suppression("mixed.case@example.test", "bounce")
    elif how == "paused":
        db.query("UPDATE subscribers SET paused_until = now() + interval '1 day' WHERE id = %s", (sid,))
    else:  # any writer, even plain SQL: the schedule trigger cancels the pending run
        db.query("UPDATE subscribers SET digest_cadence = 'weekly' WHERE id = %s", (sid,))
    result = digest_send.process([rid])
    row = run_row(rid)
    if how == "cadence":
        assert result["skipped"] == 0 and (row["status"], row["skip_reason"]) == ("cancelled", "schedule changed")
    else:
        assert result["skipped"] == 1
        assert row["status"] == "skipped" and row["skip_reason"] in ("unsubscribed", "suppressed", "paused")
    assert sink.messages() == [] and set(marked(ids).values()) == {None}


class _InsertDuringSend:
    """Wraps the real provider: an event arrives while the mail is in flight."""

    def __init__(self, inner, user_id):
        self.inner, self.user_id, self.name, self.max_batch, self.new_ids = inner, user_id, "wrap", 100, []

    def send_batch(self, mails, progress=None):
        self.new_ids += factories.events(self.user_id, 1, entity_id="late")
        return self.inner.send_batch(mails, progress)


def test_event_arriving_during_a_run_is_left_for_the_next_digest(sink):
    sid = factories.subscriber("u1")
    first = factories.events("u1", 3)
    rid = factories.digest_run(sid)
    wrapper = _InsertDuringSend(providers.get_provider(), "u1")
    digest_send.process([rid], provider=wrapper)
    assert set(marked(first).values()) == {rid}
    assert set(marked(wrapper.new_ids).values()) == {None}
    assert run_row(rid)["event_count"] == 3
    rid2 = factories.digest_run(sid, period=datetime.now(UTC).date() + timedelta(days=1))
    digest_send.process([rid2])
    assert set(marked(wrapper.new_ids).values()) == {rid2}


def test_two_workers_never_send_the_same_run(sink):
    run_ids = []
    for i in range(30):
        sid = factories.subscriber(f"u{i}")
        factories.events(f"u{i}", 2)
        run_ids.append(factories.digest_run(sid))
    barrier = threading.Barrier(4)
    errors = []

    def worker(ids):
        try:
            barrier.wait()
            digest_send.process(ids, limit=7)
            while digest_send.process(None, limit=7)["sent"]:
                pass
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(run_ids if k % 2 else run_ids[::-1],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ids = [m["Message-ID"] for m in sink.messages()]
    assert len(ids) == 30 and len(set(ids)) == 30
    assert dict(db.query("SELECT status, count(*) FROM digest_runs GROUP BY status")) == {"sent": 30}


def test_transient_failure_retries_with_backoff_and_the_same_key(sink):
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 2)
    rid = factories.digest_run(sid)
    sink.reply = "451 4.3.0 try again later"
    assert digest_send.process([rid])["retry"] == 1
    row = run_row(rid)
    assert row["status"] == "pending" and row["attempts"] == 1 and "451" in row["last_error"]
    assert row["next_attempt_at"] > datetime.now(UTC) + timedelta(seconds=30)
    assert set(marked(ids).values()) == {None}
    # the checker does not pick it up before its backoff has passed …
    sent = []
    assert digest_plan.check(datetime.now(UTC), sent.append, 0) == 0
    # … and does after it
    assert digest_plan.check(row["next_attempt_at"] + timedelta(seconds=1), sent.append, 0) == 1
    sink.reply = "250 OK"
    assert digest_send.process(sent[0])["sent"] == 0  # a message arriving early leaves it alone
    db.query("UPDATE digest_runs SET next_attempt_at = now() - interval '1 second'")  # time passes
    assert digest_send.process(sent[0])["sent"] == 1
    (msg,) = sink.messages()
    assert msg["Message-ID"].startswith(f"<digest-run-{rid}.")
    assert set(marked(ids).values()) == {rid}


def test_one_failing_render_does_not_hold_up_the_batch(sink, monkeypatch):
    good, bad = factories.subscriber("good"), factories.subscriber("bad")
    factories.events("good", 1)
    factories.events("bad", 1)
    runs = [factories.digest_run(good), factories.digest_run(bad)]
    real = digest_build.render_mail

    def flaky(run, *args):
        if run.user_id == "bad":
            raise ValueError("odd payload")
        return real(run, *args)

    monkeypatch.setattr(digest_build, "render_mail", flaky)
    assert digest_send.process(runs) == {"sent": 1, "skipped": 0, "retry": 1, "failed": 0}
    assert run_row(runs[0])["status"] == "sent"
    row = run_row(runs[1])
    assert row["status"] == "pending" and "odd payload" in row["last_error"] and row["attempts"] == 1


def test_permanent_failure_marks_the_run_failed(sink):
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 2)
    rid = factories.digest_run(sid)
    sink.reply = "550 5.1.1 no such user"
    assert digest_send.process([rid])["failed"] == 1
    row = run_row(rid)
    assert row["status"] == "failed" and "550" in row["last_error"]
    assert set(marked(ids).values()) == {None}


def test_too_many_transient_failures_end_in_failed(sink, settings):
    settings(digest_max_attempts=2)
    sid = factories.subscriber("u1")
    factories.events("u1", 1)
    rid = factories.digest_run(sid)
    sink.reply = "421 4.7.0 busy"
    digest_send.process([rid])
    assert run_row(rid)["status"] == "pending"
    db.query("UPDATE digest_runs SET next_attempt_at = now() - interval '1 second'")
    digest_send.process([rid])
    row = run_row(rid)
    assert row["status"] == "failed" and row["attempts"] == 2 and "421" in row["last_error"]


CRASH_SCRIPT = textwrap.dedent("""
    import os, sys
    from app.platform import db
    from digest import send as digest_send
    from app.platform.providers import get_provider
    db.init()
    provider = get_provider()
    real_send = provider.send_batch
    def send_then_die(mails, progress=None):
        results = real_send(mails, progress)
        assert all(r.ok for r in results), results
        os._exit(17)            # killed after the provider accepted, before the final commit
    provider.send_batch = send_then_die
    digest_send.process([int(sys.argv[1])])
""")


@pytest.mark.slow
def test_killed_between_send_and_commit_resends_with_same_key_and_marks_once(sink):
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 4)
    rid = factories.digest_run(sid)
    env = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": config.get().database_url,
        "MAIL_PROVIDER": "smtp",
        "SMTP_URL": sink.url,
        "TRACKING": "0",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(rid)], env=env, cwd=ROOT, timeout=60, capture_output=True, text=True
    )
    assert proc.returncode == 17, proc.stderr
    assert len(sink.messages()) == 1
    assert run_row(rid)["status"] == "processing" and set(marked(ids).values()) == {None}
    # the watchdog returns it once the processing timeout has passed
    later = datetime.now(UTC) + timedelta(seconds=config.get().digest_processing_timeout_seconds + 5)
    assert digest_plan.watchdog(later) == (1, 0)
    assert run_row(rid)["status"] == "pending" and run_row(rid)["attempts"] == 1
    assert digest_send.process([rid])["sent"] == 1
    first, second = sink.messages()
    assert first["Message-ID"] == second["Message-ID"]
    assert set(marked(ids).values()) == {rid} and run_row(rid)["event_count"] == 4
    every = digest_marks.handled_by(i for (i,) in db.query("SELECT id FROM digest_events"))
    assert list(every.values()).count(rid) == 4


def test_preview_renders_without_sending_or_marking(sink):
    factories.subscriber("u1")
    ids = factories.events("u1", 3)
    rendered = digest_build.preview("u1")
    assert "Like from Actor a2, Actor a1 and Actor a0" in rendered.text and "<html" in rendered.html
    assert set(marked(ids).values()) == {None} and sink.messages() == []
    assert db.query("SELECT count(*) FROM digest_runs")[0][0] == 0
    factories.subscriber("quiet")
    assert digest_build.preview("quiet") is None
    with pytest.raises(LookupError):
        digest_build.preview("nobody")


@pytest.mark.parametrize("opt_out", [False, True])
def test_links_are_tracked_unless_the_subscriber_opted_out(sink, settings, opt_out):
    settings(tracking=True)
    sid = factories.subscriber("u1", tracking_opt_out=opt_out)
    factories.events("u1", 2, payload={"title": "Post", "url": "https://example.test/post/1"})
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    html = sink.messages()[0].get_body(("html",)).get_content()
    assert "/u/" in html and "/preferences/" in html  # unsubscribe links stay direct
    if opt_out:
        assert 'href="https://example.test/post/1"' in html and "/o/" not in html
    else:
        assert "https://example.test/post/1" not in html and "/c/" in html and "/o/" in html
        assert db.query("SELECT mail_kind, mail_id, url FROM email_links") == [
            ("digest", rid, "https://example.test/post/1")
        ]


def test_a_subscriber_never_has_two_runs_processing(sink):
    sid = factories.subscriber("u1")
    factories.events("u1", 2)
    today = datetime.now(UTC).date()  # once: the default period (a minute ago) is yesterday's at 00:00
    busy = factories.digest_run(sid, period=today - timedelta(days=1), status="processing")
    waiting = factories.digest_run(sid, period=today)
    # both would read the same unsent events: the second waits until the first is done
    assert digest_send.process([waiting]) == {"sent": 0, "skipped": 0, "retry": 0, "failed": 0}
    assert run_row(waiting)["status"] == "pending"
    db.query("UPDATE digest_runs SET status = 'sent' WHERE id = %s", (busy,))
    assert digest_send.process([waiting])["sent"] == 1
