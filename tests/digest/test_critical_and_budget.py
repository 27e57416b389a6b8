"""Critical events and the mail budget (issue 40, items 3 and 4), through the API, the send-now pass,
the claim and an SMTP sink, on real Postgres and Redis.

Critical: sent at once in a mail of its own whatever the subscriber's quiet hours, budget or hourly
limit; what quiet hours hold stays held for the window's end. Budget: every mail of the local day
counts; send-now mail over it folds into the next digest (an `immediately` subscriber's waits for
their next local day), digests and critical mail still go; exact when two workers send at once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.platform import db, metrics
from app.subscribers import budget
from digest import immediate
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.digest.test_quiet_hours_hold import ZONE, _stored, _window_ends, around_now
from tests.digest_support import run_row, sink_as_provider


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


_seq = iter(range(1, 100_000))


def ev(user: str, entity: str = "p1", category: str = "like", **extra) -> dict:
    n = next(_seq)
    return {
        "id": f"cb{n}",
        "user_id": user,
        "category": category,
        "entity_type": "post",
        "entity_id": entity,
        "actor_id": f"a{n}",
        "actor_name": f"Actor {n}",
        **extra,
    }


def post(client, key, *events) -> None:
    r = client.post("/v1/events", json={"events": list(events)}, headers=auth(key))
    assert r.status_code == 202, r.text


def send_now_pass() -> list[int]:
    """What the send_now actor does: one pass, then send the runs due now."""
    _, run_ids = immediate.plan(datetime.now(UTC), sending_now=True)
    if run_ids:
        digest_send.process(run_ids)
    return run_ids


def text_of(msg) -> str:
    return msg.get_body(("plain",)).get_content()


def runs_of(sid: int) -> list[tuple]:
    return db.query(
        "SELECT cadence, status, coalesce(skip_reason, '') FROM digest_runs WHERE subscriber_id = %s ORDER BY id",
        (sid,),
    )


# -- critical ---------------------------------------------------------------------------------------
def test_priority_critical_is_validated_and_other_levels_refused(client, events_key):
    r = client.post("/v1/events", json=ev("x", priority="urgent"), headers=auth(events_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "priority"
    post(client, events_key, ev("x", priority="critical"))
    assert db.query("SELECT high_priority, critical FROM digest_events WHERE user_id = 'x'") == [(True, True)]


def test_a_critical_event_goes_at_once_in_quiet_hours_and_what_they_hold_stays_held(client, events_key, sink):
    sid = factories.subscriber("owl", digest_cadence="immediately", timezone=ZONE, quiet_hours=_stored(around_now()))
    post(client, events_key, ev("owl", entity="chat"))
    assert send_now_pass() == [] or sink.messages() == []  # held by quiet hours
    assert sink.messages() == []
    before = metrics.CRITICAL_EVENTS.labels("unregistered")._value.get()
    post(client, events_key, ev("owl", entity="login", category="security-alert", priority="critical"))
    assert metrics.CRITICAL_EVENTS.labels("unregistered")._value.get() == before + 1
    send_now_pass()
    (alert,) = sink.messages()
    assert "Post login" in text_of(alert) and "Post chat" not in text_of(alert)
    assert "while you were away" not in text_of(alert)
    assert ("critical", "sent", "") in runs_of(sid) and ("immediately", "pending", "") in runs_of(sid)
    # more ordinary mail joins the held run; the window ends: one mail, without the alert
    post(client, events_key, ev("owl", entity="chat2"))
    send_now_pass()
    assert len(sink.messages()) == 1
    _window_ends(sid)
    assert digest_send.process(None)["sent"] == 1
    held = text_of(sink.messages()[1])
    assert "Post chat" in held and "Post chat2" in held and "Post login" not in held
    assert "while you were away" in held


def test_a_critical_event_reaches_a_daily_subscriber_alone_and_not_again_in_the_digest(client, events_key, sink):
    sid = factories.subscriber("d")
    post(client, events_key, ev("d", entity="calm"), ev("d", entity="urgent", priority="high"))
    post(client, events_key, ev("d", entity="breach", priority="critical"))
    send_now_pass()  # the critical run first; the high-priority run of the same pass waits for it
    digest_send.process(None)
    texts = sorted(text_of(m) for m in sink.messages())
    assert len(texts) == 2  # the critical mail and the high-priority one, each alone
    assert sum("Post breach" in t for t in texts) == 1 and sum("Post urgent" in t for t in texts) == 1
    assert not any("Post breach" in t and "Post urgent" in t for t in texts)
    digest_send.process([factories.digest_run(sid)])
    digest = text_of(sink.messages()[2])
    assert "Post calm" in digest and "breach" not in digest and "urgent" not in digest


def test_a_critical_run_passes_the_hourly_limit_and_the_budget(client, events_key, sink, settings):
    settings(immediate_max_per_hour=1)
    sid = factories.subscriber("i", digest_cadence="immediately", max_mails_per_day=1)
    post(client, events_key, ev("i", entity="one"))
    send_now_pass()
    post(client, events_key, ev("i", entity="two"))
    send_now_pass()  # the hourly limit holds it an hour
    assert len(sink.messages()) == 1
    post(client, events_key, ev("i", entity="alarm", priority="critical"))
    send_now_pass()
    assert len(sink.messages()) == 2 and "Post alarm" in text_of(sink.messages()[1])
    assert budget.spent_today(sid, datetime.now(UTC)) == (2, 1)  # it counted, and went over


def test_a_schedule_change_leaves_a_waiting_critical_run_alone(client, admin_key, events_key, sink):
    sid = factories.subscriber("s")
    post(client, events_key, ev("s", entity="breach", priority="critical"))
    immediate.plan(datetime.now(UTC))  # the run is made, not yet sent
    r = client.patch("/v1/subscribers/s", json={"digest_hour": 7}, headers=auth(admin_key))
    assert r.status_code == 200
    assert runs_of(sid) == [("critical", "pending", "")]
    assert digest_send.process(None)["sent"] == 1


# -- the budget -------------------------------------------------------------------------------------
def test_send_now_mail_over_budget_folds_into_the_next_digest(client, events_key, sink):
    sid = factories.subscriber("d", max_mails_per_day=2)
    for entity in ("one", "two", "three"):
        post(client, events_key, ev("d", entity=entity, priority="high"))
        send_now_pass()
    assert len(sink.messages()) == 2
    assert runs_of(sid)[-1] == ("immediately", "skipped", "mail budget spent: folded into the next digest")
    held_before = metrics.MAIL_HELD.labels("budget")._value.get()
    post(client, events_key, ev("d", entity="four", priority="high"))
    send_now_pass()
    assert metrics.MAIL_HELD.labels("budget")._value.get() == held_before + 1
    digest_send.process([factories.digest_run(sid)])  # a digest still goes, over the budget
    (digest,) = sink.messages()[2:]
    assert "Post three" in text_of(digest) and "Post four" in text_of(digest) and "Post one" not in text_of(digest)
    assert budget.spent_today(sid, datetime.now(UTC)) == (3, 2)


def test_an_immediately_subscribers_mail_over_budget_waits_for_their_next_day(client, events_key, sink):
    sid = factories.subscriber("i", digest_cadence="immediately", timezone="America/New_York", max_mails_per_day=1)
    post(client, events_key, ev("i", entity="one"))
    send_now_pass()
    post(client, events_key, ev("i", entity="two"))
    send_now_pass()
    assert len(sink.messages()) == 1
    [(rid, due, held_at)] = db.query(
        "SELECT id, scheduled_for, held_at FROM digest_runs WHERE subscriber_id = %s AND status = 'pending'", (sid,)
    )
    local_midnight = datetime.combine(
        datetime.now(ZoneInfo("America/New_York")).date() + timedelta(days=1),
        datetime.min.time(),
        ZoneInfo("America/New_York"),
    )
    assert due == local_midnight and held_at is None and run_row(rid)["attempts"] == 0
    # the next local day: it goes, with what came meanwhile, and counts on that day
    post(client, events_key, ev("i", entity="three"))
    send_now_pass()
    db.query("UPDATE digest_runs SET scheduled_for = now(), next_attempt_at = NULL WHERE id = %s", (rid,))
    db.query("UPDATE mail_budget SET day = day - 1 WHERE subscriber_id = %s", (sid,))  # yesterday's count
    assert digest_send.process(None)["sent"] == 1
    text = text_of(sink.messages()[1])
    assert "Post two" in text and "Post three" in text and "while you were away" not in text


def test_the_default_budget_applies_to_those_without_one_and_zero_is_no_limit(client, events_key, sink, settings):
    settings(default_max_mails_per_day=1)
    factories.subscriber("capped")
    factories.subscriber("free", max_mails_per_day=0)
    for entity in ("one", "two"):
        urgent = [ev(user, entity=entity, priority="high") for user in ("capped", "free")]
        post(client, events_key, *urgent)
        send_now_pass()
    to = sorted(m["To"].addresses[0].username for m in sink.messages())
    assert to == ["capped", "free", "free"]
    assert db.query(
        "SELECT count(*) FROM mail_budget m JOIN subscribers s ON s.id = m.subscriber_id WHERE s.user_id = 'free'"
    ) == [(0,)]  # no limit: nothing counted


def test_the_budget_is_exact_when_two_workers_spend_for_one_subscriber_at_once():
    """Many threads, each its own connection and transaction, spend for one subscriber with a budget
    of 5: exactly five are counted; the rest are refused. Repeated so the threads really meet."""
    sid = factories.subscriber("busy", max_mails_per_day=5)
    now = datetime.now(UTC)
    for _ in range(5):
        db.query("DELETE FROM mail_budget WHERE subscriber_id = %s", (sid,))
        start = threading.Barrier(8)
        granted: list[bool] = []

        def spender() -> None:
            start.wait()
            refused = db.call(budget.spend, [budget.Spend(sid, "UTC", 5, must=False)], now).refused
            granted.append(sid not in refused)

        threads = [threading.Thread(target=spender) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert granted.count(True) == 5, granted
        assert budget.spent_today(sid, now) == (5, 5)


def test_two_workers_sending_one_subscribers_mail_send_exactly_the_budget(client, events_key, sink, settings):
    """Two send paths at once for one subscriber with a budget of 3 (digest claims and newsletter
    claims): counted once each, never more than three mails that could wait."""
    from app.newsletter import rows as newsletter_rows
    from app.newsletter import waits

    sid = factories.subscriber("nl", max_mails_per_day=3)
    newsletters = []
    for i in range(6):
        with db.raw_cursor() as cur:
            nid = newsletter_rows.create(cur, f"N{i}", "<p>hi</p>", None, None)
            cur.execute("UPDATE newsletters SET status = 'sending', outbox_completed_at = now() WHERE id = %s", (nid,))
            cur.execute(
                "INSERT INTO email_log (newsletter_id, subscriber_id, email, status) "
                "VALUES (%s, %s, 'nl@example.test', 'pending')",
                (nid, sid),
            )
        newsletters.append(nid)
    start = threading.Barrier(6)
    going: list[int] = []

    def claimer(nid: int) -> None:
        start.wait()
        going.extend(r.id for r in db.call(waits.claim, nid, 10, 0, False).rows)

    threads = [threading.Thread(target=claimer, args=(nid,)) for nid in newsletters]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(going) == 3
    statuses = db.query(
        "SELECT status, count(*), bool_and(coalesce(not_before > now(), false)), sum(attempts) FROM email_log "
        "WHERE subscriber_id = %s GROUP BY status ORDER BY status",
        (sid,),
    )
    # the three that wait are due the next local day, their claim's attempt refunded
    assert statuses == [("pending", 3, True, 0), ("sending", 3, False, 3)]


# -- only mail that goes stays counted ----------------------------------------------------------------
def test_a_counted_mail_that_does_not_go_is_given_back_and_a_retry_counts_once(client, events_key, sink):
    sid = factories.subscriber("d", max_mails_per_day=2)
    digest_send.process([factories.digest_run(sid)])  # a digest with nothing in it: skipped, not counted
    assert sink.messages() == [] and budget.spent_today(sid, datetime.now(UTC)) == (0, 2)
    sink.reject_data["d@example.test"] = "451 4.3.0 try again later"
    post(client, events_key, ev("d", entity="one", priority="high"))
    send_now_pass()  # refused for now: a retry, given back
    [(rid, status)] = db.query("SELECT id, status FROM digest_runs WHERE cadence = 'immediately'")
    assert status == "pending" and budget.spent_today(sid, datetime.now(UTC)) == (0, 2)
    del sink.reject_data["d@example.test"]
    db.query("UPDATE digest_runs SET next_attempt_at = NULL WHERE id = %s", (rid,))
    assert digest_send.process([rid])["sent"] == 1
    assert budget.spent_today(sid, datetime.now(UTC)) == (1, 2)  # the mail that went, once


def test_a_newsletter_mail_that_does_not_go_is_given_back(client, sink, settings):
    from app.newsletter import outbox, sender, service

    settings(newsletter_max_attempts=1)
    sid = factories.subscriber("n", max_mails_per_day=1)
    sink.reject_data["n@example.test"] = "554 5.7.1 refused"
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"})
    outbox.create_outbox(nl)
    sender.send_batch(nl, reenqueue=False)
    assert db.query("SELECT status FROM email_log") == [("failed",)]
    assert budget.spent_today(sid, datetime.now(UTC)) == (0, 1)  # failed for good: not a mail of the day
