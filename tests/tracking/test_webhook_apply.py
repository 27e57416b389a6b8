"""Applying stored SendGrid events: suppressions, soft bounces, per-mail counts, exactly once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from app.platform import db
from tests import factories
from tracking import stats, webhook_apply


@pytest.fixture(autouse=True)
def soft_limit(settings):
    settings(soft_bounce_limit=3)


ANA = "Ana@Example.com"
NEWSLETTER_ID = 9  # the mail_id args() puts in custom_args


_seq = iter(range(1, 10**9))


def store(*evs: dict) -> list[int]:
    ids = []
    for ev in evs:
        ev = {"sg_event_id": f"sg-{next(_seq)}", **ev}
        ((i,),) = db.query(
            "INSERT INTO webhook_events (sg_event_id, event, email, payload) VALUES (%s, %s, %s, %s) RETURNING id",
            (ev["sg_event_id"], ev["event"], ev.get("email"), orjson.dumps(ev).decode()),
        )
        ids.append(i)
    return ids


def suppressions():
    return db.query("SELECT email, reason FROM suppressions ORDER BY email")


def args(sub_id, mail_kind="newsletter", mail_id=NEWSLETTER_ID, row_id=1):
    return {"mail_kind": mail_kind, "mail_id": str(mail_id), "row_id": str(row_id), "subscriber_id": str(sub_id)}


@pytest.mark.parametrize(
    "event, extra, reason",
    [
        ("bounce", {"type": "bounce"}, "bounce"),
        ("bounce", {"type": "blocked"}, "block"),
        ("spamreport", {}, "spamreport"),
        ("unsubscribe", {}, "unsubscribe"),
        ("group_unsubscribe", {"asm_group_id": 1}, "unsubscribe"),
        ("dropped", {"reason": "Bounced Address"}, "bounce"),
        ("dropped", {"reason": "Unsubscribed Address"}, "unsubscribe"),
        ("dropped", {"reason": "Spam Reporting Address"}, "spamreport"),
    ],
)
def test_immediate_suppressions(event, extra, reason):
    sid = factories.subscriber(ANA, ANA)
    ids = store({"event": event, "email": "Ana@Example.COM", **extra, **args(sid)})
    assert webhook_apply.apply_events(ids) == 1
    assert suppressions() == [("ana@example.com", reason)]
    assert db.query("SELECT processed_at IS NOT NULL, error FROM webhook_events") == [(True, None)]


@pytest.mark.parametrize(
    "event, extra",
    [
        ("delivered", {}),
        ("open", {}),
        ("click", {"url": "https://x"}),
        ("processed", {}),
        ("dropped", {"reason": "Invalid SMTPAPI header"}),
    ],
)
def test_other_events_do_not_suppress(event, extra):
    ids = store({"event": event, "email": "a@example.com", **extra, **args(factories.subscriber(ANA, ANA))})
    webhook_apply.apply_events(ids)
    assert suppressions() == []


def test_soft_bounces_suppress_after_the_limit_counting_messages_not_retries():
    sid = factories.subscriber(ANA, ANA)
    ids = store(
        {"event": "deferred", "email": "ana@example.com", "attempt": "1", **args(sid)},
        {"event": "deferred", "email": "ana@example.com", "attempt": "2", **args(sid)},  # same message
        {"event": "deferred", "email": "ana@example.com", "attempt": "5", **args(sid)},
        {"event": "deferred", "email": "ana@example.com", "attempt": "1", **args(sid)},
    )
    webhook_apply.apply_events(ids)
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(2,)]
    assert suppressions() == []
    webhook_apply.apply_events(store({"event": "deferred", "email": "ana@example.com", **args(sid)}))
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(3,)]
    assert suppressions() == [("ana@example.com", "soft_bounce")]


def test_delivery_resets_the_soft_bounce_count():
    sid = factories.subscriber(ANA, ANA)
    webhook_apply.apply_events(store(*[{"event": "deferred", "email": "ana@example.com", **args(sid)}] * 2))
    webhook_apply.apply_events(store({"event": "delivered", "email": "ana@example.com", **args(sid)}))
    webhook_apply.apply_events(store({"event": "deferred", "email": "ana@example.com", **args(sid)}))
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(1,)]
    assert suppressions() == []


def test_events_without_custom_args_map_by_email():
    factories.subscriber("Bob@Example.com", "Bob@Example.com")
    webhook_apply.apply_events(store(*[{"event": "deferred", "email": "BOB@example.com"}] * 3))
    assert suppressions() == [("bob@example.com", "soft_bounce")]


def test_counts_per_mail_and_stats():
    sid = factories.subscriber("a@example.com", "a@example.com")
    bob = factories.subscriber("b@example.com", "b@example.com")
    nl = factories.newsletter_row(id=NEWSLETTER_ID)
    row, bob_row = factories.outbox_row(nl, sid), factories.outbox_row(nl, bob)
    run = factories.digest_run(sid, status="sent")
    webhook_apply.apply_events(
        store(
            *[{"event": "delivered", "email": "a@example.com", **args(sid, row_id=row)}] * 3,
            {"event": "open", "email": "a@example.com", **args(sid, row_id=row)},
            {"event": "bounce", "email": "b@example.com", **args(bob, row_id=bob_row)},
            {"event": "delivered", "email": "a@example.com", **args(sid, "digest", run, row_id=run)},
        )
    )
    assert stats.mail_stats("newsletter", NEWSLETTER_ID)["events"] == {"bounce": 1, "delivered": 3, "open": 1}
    assert stats.mail_stats("digest", run)["events"] == {"delivered": 1}


def test_applying_twice_or_concurrently_has_one_effect():
    sid, other = factories.subscriber(ANA, ANA), factories.subscriber("other@example.com", "other@example.com")
    other_row = factories.outbox_row(factories.newsletter_row(id=NEWSLETTER_ID), other)
    ids = store(
        *[{"event": "delivered", "email": "other@example.com", **args(other, row_id=other_row)}] * 200,
        *[{"event": "deferred", "email": "ana@example.com", "attempt": "1", **args(sid)}] * 2,
    )
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(webhook_apply.apply_events, [ids] * 4))
    assert sum(done) == 202
    assert webhook_apply.apply_events(ids) == 0
    assert stats.mail_stats("newsletter", NEWSLETTER_ID)["events"]["delivered"] == 200
    assert db.query("SELECT soft_bounce_count FROM subscribers WHERE id = %s", (sid,)) == [(2,)]


def test_unusable_event_is_marked_with_its_error_and_others_still_apply(monkeypatch):
    real_apply_one = webhook_apply._apply_one

    def apply_one(cur, event, email, payload, *rest):
        if email == "boom@example.com":  # a real data error from Postgres for this one event
            cur.execute("SELECT 1 / 0")
        return real_apply_one(cur, event, email, payload, *rest)

    monkeypatch.setattr(webhook_apply, "_apply_one", apply_one)
    sid = factories.subscriber(ANA, ANA)
    ids = store(
        {"event": "bounce", "email": "boom@example.com", **args(sid)},
        {"event": "bounce", "email": "ok@example.com", **args(sid)},
        {"event": "open", "mail_kind": "newsletter", "mail_id": "not-a-number"},
    )
    assert webhook_apply.apply_events(ids) == 3
    assert suppressions() == [("ok@example.com", "bounce")]
    errors = db.query("SELECT error FROM webhook_events ORDER BY id")
    assert "DivisionByZero" in errors[0][0] and errors[1][0] is None and errors[2][0] is None
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_a_bug_hit_by_one_event_fails_it_alone_instead_of_retrying_the_chunk_forever(monkeypatch):
    real_apply_one = webhook_apply._apply_one

    def apply_one(cur, event, email, payload, *rest):
        if email == "odd@example.com":  # not a database error: a bug this one event runs into
            raise KeyError("a payload shape nobody expected")
        return real_apply_one(cur, event, email, payload, *rest)

    monkeypatch.setattr(webhook_apply, "_apply_one", apply_one)
    sid = factories.subscriber(ANA, ANA)
    ids = store(
        {"event": "bounce", "email": "odd@example.com", **args(sid)},
        {"event": "bounce", "email": "ok@example.com", **args(sid)},
    )
    assert webhook_apply.apply_events(ids) == 2
    assert suppressions() == [("ok@example.com", "bounce")]
    errors = db.query("SELECT error FROM webhook_events ORDER BY id")
    assert "KeyError" in errors[0][0] and errors[1][0] is None
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_requeue_unprocessed_enqueues_only_stale_unprocessed_rows(monkeypatch):
    sent = []
    monkeypatch.setattr(webhook_apply, "enqueue", lambda ids: sent.append(list(ids)))
    old_new, old_done, _fresh = store({"event": "open"}, {"event": "open"}, {"event": "open"})
    db.query(
        "UPDATE webhook_events SET received_at = now() - interval '5 minutes' WHERE id IN (%s, %s)", (old_new, old_done)
    )
    db.query("UPDATE webhook_events SET processed_at = now() WHERE id = %s", (old_done,))
    assert webhook_apply.requeue_unprocessed() == 1
    assert sent == [[old_new]]


def test_requeue_goes_through_redis_and_survives_a_flush(redis_client):
    """Redis is only a hint: after a flush the scheduler's requeue puts the work back."""
    import dramatiq

    from actors import webhooks as webhook_actors

    broker = dramatiq.get_broker()
    ids = store({"event": "spamreport", "email": "s@example.com"})
    webhook_apply.enqueue(ids)
    assert broker.client.llen(f"{broker.namespace}:{webhook_actors.apply_webhook_events.queue_name}") == 1
    broker.flush_all()
    db.query("UPDATE webhook_events SET received_at = now() - interval '2 minutes'")
    assert webhook_apply.requeue_unprocessed() == 1
    worker = dramatiq.Worker(broker, queues={"webhooks"}, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        broker.join("webhooks", timeout=20_000)
    finally:
        worker.stop()
    assert suppressions() == [("s@example.com", "spamreport")]


def test_custom_args_of_another_subscriber_neither_count_nor_suppress_them():
    """An event naming a@ whose custom_args point at b@'s subscriber, outbox row and digest run
    acts on a@ (by its address) and leaves b@ untouched."""
    _, b = factories.subscriber("a@x.test", "a@x.test"), factories.subscriber("b@x.test", "b@x.test")
    b_row = factories.outbox_row(factories.newsletter_row(id=NEWSLETTER_ID), b)
    b_run = factories.digest_run(b, status="sent")
    db.query("UPDATE subscribers SET soft_bounce_count = 2 WHERE id = %s", (b,))
    at_b = args(b, row_id=b_row)
    webhook_apply.apply_events(
        store(
            *[{"event": "deferred", "email": "A@x.test", "attempt": "1", **at_b}] * 2,
            {"event": "bounce", "email": "a@x.test", **at_b},
            {"event": "open", "email": "a@x.test", **at_b},
            {"event": "processed", "email": "a@x.test", **args(b, "digest", b_run, row_id=b_run)},
        )
    )
    assert suppressions() == [("a@x.test", "bounce")]
    assert db.query("SELECT email, soft_bounce_count FROM subscribers ORDER BY id") == [
        ("a@x.test", 2),
        ("b@x.test", 2),
    ]
    assert db.query("SELECT count(*) FROM mail_event_counts") == [(0,)]
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL OR error IS NOT NULL") == [(0,)]


def test_a_delivery_to_one_address_does_not_reset_another_subscribers_soft_bounces():
    _, b = factories.subscriber("a@x.test", "a@x.test"), factories.subscriber("b@x.test", "b@x.test")
    db.query("UPDATE subscribers SET soft_bounce_count = 2")
    webhook_apply.apply_events(store({"event": "delivered", "email": "a@x.test", **args(b)}))
    assert db.query("SELECT email, soft_bounce_count FROM subscribers ORDER BY id") == [
        ("a@x.test", 0),
        ("b@x.test", 2),
    ]


def test_an_event_without_an_address_touches_no_subscriber():
    sid = factories.subscriber("a@x.test", "a@x.test")
    row = factories.outbox_row(factories.newsletter_row(id=NEWSLETTER_ID), sid)
    run = factories.digest_run(sid, status="sent")
    webhook_apply.apply_events(
        store(
            *[{"event": "deferred", **args(sid, row_id=row)}] * 3,
            {"event": "delivered", **args(sid, "digest", run, row_id=run)},
        )
    )
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(0,)]
    assert suppressions() == [] and db.query("SELECT count(*) FROM mail_event_counts") == [(0,)]
