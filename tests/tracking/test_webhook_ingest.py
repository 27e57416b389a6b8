"""POST /webhooks/sendgrid: signatures, 2xx only once committed (I4), idempotent, concurrent-safe."""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import psycopg2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.platform import config, db, groupcommit
from tests.conftest import wait_for
from tracking import webhook_apply, webhook_intake


@pytest.fixture(scope="module")
def key_pair():
    private = ec.generate_private_key(ec.SECP256R1())
    public = base64.b64encode(
        private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).decode()
    return private, public


@pytest.fixture
def signed(settings, key_pair):
    private, public = key_pair
    settings(sendgrid_webhook_public_key=public, sendgrid_webhook_max_age_seconds=600)

    def sign(body: bytes, ts: int | None = None) -> dict:
        ts = str(int(time.time()) if ts is None else ts)
        sig = base64.b64encode(private.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))).decode()
        return {
            "X-Twilio-Email-Event-Webhook-Signature": sig,
            "X-Twilio-Email-Event-Webhook-Timestamp": ts,
            "Content-Type": "application/json",
        }

    return sign


@pytest.fixture
def enqueued(monkeypatch):
    calls = []
    monkeypatch.setattr(webhook_apply, "enqueue", lambda ids: calls.append(list(ids)))
    return calls


def events(n: int, prefix: str = "ev", start: int = 0) -> list[dict]:
    return [
        {
            "email": f"User{i}@Example.com",
            "event": "delivered",
            "sg_event_id": f"{prefix}-{i}",
            "sg_message_id": f"msg-{i}",
            "timestamp": 1700000000 + i,
            "mail_kind": "newsletter",
            "mail_id": "7",
            "row_id": str(i),
            "subscriber_id": str(i),
        }
        for i in range(start, start + n)
    ]


def stored_ids() -> list[str]:
    return [r[0] for r in db.query("SELECT sg_event_id FROM webhook_events ORDER BY sg_event_id")]


def test_signed_batch_is_stored_and_enqueued_after_commit(client, signed, enqueued):
    body = orjson.dumps(events(3))
    r = client.post("/webhooks/sendgrid", content=body, headers=signed(body))
    assert r.status_code == 200, r.text
    assert r.json() == {"stored": 3, "duplicates": 0}
    assert stored_ids() == ["ev-0", "ev-1", "ev-2"]
    row = db.query("SELECT event, email, payload, processed_at FROM webhook_events WHERE sg_event_id = 'ev-1'")[0]
    assert row[:2] == ("delivered", "User1@Example.com") and row[2]["mail_id"] == "7" and row[3] is None
    deadline = time.monotonic() + 5
    while not enqueued and time.monotonic() < deadline:  # the hook runs right after the commit
        time.sleep(0.01)
    ids = [r[0] for r in db.query("SELECT id FROM webhook_events ORDER BY id")]
    assert sorted(i for call in enqueued for i in call) == ids


@pytest.mark.parametrize("case", ["missing", "bad", "stale", "future", "other_body"])
def test_bad_signatures_are_403_and_store_nothing(client, signed, case):
    body = orjson.dumps(events(2))
    headers = signed(body)
    if case == "missing":
        headers.pop("X-Twilio-Email-Event-Webhook-Signature")
    elif case == "bad":
        headers["X-Twilio-Email-Event-Webhook-Signature"] = signed(b"something else")[
            "X-Twilio-Email-Event-Webhook-Signature"
        ]
    elif case == "stale":
        headers = signed(body, ts=int(time.time()) - 601)
    elif case == "future":
        headers = signed(body, ts=int(time.time()) + 601)
    elif case == "other_body":
        body = orjson.dumps(events(3))
    r = client.post("/webhooks/sendgrid", content=body, headers=headers)
    assert r.status_code == 403 and r.json()["error"] == "bad_signature"
    assert stored_ids() == []


def test_without_a_configured_key_unsigned_posts_are_accepted(client, settings, enqueued):
    settings(sendgrid_webhook_public_key="")
    r = client.post("/webhooks/sendgrid", content=orjson.dumps(events(1)))
    assert r.status_code == 200 and stored_ids() == ["ev-0"]


@pytest.mark.parametrize("body", [b"{not json", b"", b"42", b"[1, 2]", b'[{"event": "open"}, "x"]'])
def test_malformed_bodies_are_400(client, signed, body):
    r = client.post("/webhooks/sendgrid", content=body, headers=signed(body))
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"
    assert stored_ids() == []


def test_body_over_the_limit_is_413(client, signed, settings):
    settings(sendgrid_webhook_max_body_bytes=1000)
    body = orjson.dumps(events(20))
    r = client.post("/webhooks/sendgrid", content=body, headers=signed(body))
    assert r.status_code == 413


def test_redelivery_stores_each_event_once(client, signed, enqueued):
    body = orjson.dumps(events(5))
    assert client.post("/webhooks/sendgrid", content=body, headers=signed(body)).json() == {
        "stored": 5,
        "duplicates": 0,
    }
    body2 = orjson.dumps(events(5) + events(2, start=5) + events(1, start=5))  # overlap + in-batch repeat
    assert client.post("/webhooks/sendgrid", content=body2, headers=signed(body2)).json() == {
        "stored": 2,
        "duplicates": 6,
    }
    assert stored_ids() == sorted(f"ev-{i}" for i in range(7))


def test_events_without_sg_event_id_still_deduplicate(client, signed, enqueued):
    body = b'[{"event": "open", "email": "a@example.com", "timestamp": 1}]'
    for _ in range(2):
        client.post("/webhooks/sendgrid", content=body, headers=signed(body))
    ((sg_id,),) = db.query("SELECT sg_event_id FROM webhook_events")
    assert sg_id.startswith("sha256:")


def test_500_event_batch(client, signed, enqueued):
    body = orjson.dumps(events(500))
    r = client.post("/webhooks/sendgrid", content=body, headers=signed(body))
    assert r.json() == {"stored": 500, "duplicates": 0}
    assert db.query("SELECT count(*), count(DISTINCT sg_event_id) FROM webhook_events") == [(500, 500)]
    ids = [r[0] for r in db.query("SELECT id FROM webhook_events")]
    assert webhook_apply.apply_events(ids) == 500
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_concurrent_deliveries_of_the_same_batch(live_server, signed, enqueued):
    """SendGrid retrying while the first delivery is still in flight: exactly one row per event,
    and across all answers every event is counted stored exactly once."""
    batches = [events(300, start=0), events(300, start=150), events(300, start=0)]
    bodies = [orjson.dumps(b) for b in batches] * 4

    def post(body):
        with httpx.Client(base_url=live_server, timeout=30) as c:
            return c.post("/webhooks/sendgrid", content=body, headers=signed(body))

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, bodies))
    assert all(a.status_code == 200 for a in answers)
    assert sum(a.json()["stored"] for a in answers) == 450
    assert sum(a.json()["duplicates"] for a in answers) == 12 * 300 - 450
    assert db.query("SELECT count(*), count(DISTINCT sg_event_id) FROM webhook_events") == [(450, 450)]


def test_database_down_is_503_and_nothing_enqueued(client, signed, settings, enqueued):
    body = orjson.dumps(events(2))
    assert client.post("/webhooks/sendgrid", content=body, headers=signed(body)).status_code == 200
    # The hint is sent after the answer, from its own thread: wait for it, or it may land below.
    wait_for(lambda: enqueued == [[1, 2]], 10, "the first delivery's hint")
    writer = webhook_intake.writer()
    real_url = config.get().database_url
    settings(database_url="postgresql://127.0.0.1:1/nowhere")
    writer._conn.close()  # as if the server went away; the writer must reconnect (and fail)
    enqueued.clear()
    body2 = orjson.dumps(events(2, start=10))
    r = client.post("/webhooks/sendgrid", content=body2, headers=signed(body2))
    assert r.status_code == 503 and r.headers["retry-after"]
    assert enqueued == []
    settings(database_url=real_url)  # the database is back
    r = client.post("/webhooks/sendgrid", content=body2, headers=signed(body2))  # SendGrid's retry
    assert r.status_code == 200 and r.json()["stored"] == 2


def _writer_with(commit_jobs, **kw):
    def connect():
        conn = db.connect_raw()
        with conn.cursor() as cur:
            cur.execute("SET deadlock_timeout = '500ms'; SET application_name = 'test-gc-writer'")
        conn.commit()
        return conn

    return groupcommit.GroupCommitWriter("test", commit_jobs, connect=connect, **kw)


@pytest.mark.slow
def test_deadlock_is_retried_with_backoff():
    """A real deadlock: another transaction holds 'b' and then wants 'a' while the writer holds 'a'
    and waits for 'b'. Postgres aborts the writer (shorter deadlock_timeout); the writer retries
    and answers with the committed truth."""
    writer = _writer_with(webhook_intake.insert_jobs)
    other = db.connect_raw()
    try:
        with other.cursor() as cur:
            cur.execute("SET deadlock_timeout = '60s'")
            cur.execute("INSERT INTO webhook_events (sg_event_id, event, payload) VALUES ('b', 'x', '{}')")
            fut = writer.submit([("a", "x", None, "{}"), ("b", "x", None, "{}")], 2)
            deadline = time.monotonic() + 10
            while not db.query(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'test-gc-writer' AND wait_event_type = 'Lock'"
            ):
                assert time.monotonic() < deadline, "writer never blocked"
                time.sleep(0.005)
            cur.execute("INSERT INTO webhook_events (sg_event_id, event, payload) VALUES ('a', 'x', '{}')")
        other.commit()
        result = fut.result(timeout=30)
    finally:
        other.close()
    assert writer.retried >= 1
    assert (result.stored, result.duplicates) == (0, 2)
    assert stored_ids() == ["a", "b"]


def _insert_suppressions(cur, jobs):
    for rows in jobs:
        for email, reason in rows:
            cur.execute("INSERT INTO suppressions (email, reason) VALUES (%s, %s)", (email, reason))
    return [len(rows) for rows in jobs]


def test_real_constraint_violation_is_raised_not_swallowed_nor_retried():
    writer = _writer_with(_insert_suppressions, wait_ms=300)
    bad = writer.submit([("x@example.com", "not-a-reason")])
    good = writer.submit([("y@example.com", "manual")])  # shares the group with the bad one
    with pytest.raises(psycopg2.errors.CheckViolation):
        bad.result(timeout=10)
    assert good.result(timeout=10) == 1
    assert writer.retried == 0
    assert db.query("SELECT email FROM suppressions") == [("y@example.com",)]


@pytest.mark.slow
def test_end_to_end_through_the_real_broker_and_worker(client, signed, redis_client):
    """Webhook → commit → Dramatiq message on Redis → worker applies → suppression."""
    import dramatiq

    from actors import broker as actor_broker  # noqa: F401  (sets the Redis broker up)
    from actors import webhooks as webhook_actors

    broker = dramatiq.get_broker()
    broker.flush_all()
    body = orjson.dumps(
        [
            {
                "email": "Bounced@Example.com",
                "event": "bounce",
                "type": "bounce",
                "sg_event_id": "b-1",
                "mail_kind": "newsletter",
                "mail_id": "3",
                "subscriber_id": "1",
            }
        ]
    )
    assert client.post("/webhooks/sendgrid", content=body, headers=signed(body)).status_code == 200
    worker = dramatiq.Worker(broker, queues={"webhooks"}, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        broker.join(webhook_actors.apply_webhook_events.queue_name, timeout=20_000)
    finally:
        worker.stop()
    assert db.query("SELECT email, reason FROM suppressions") == [("bounced@example.com", "bounce")]
    assert db.query("SELECT processed_at IS NOT NULL FROM webhook_events") == [(True,)]


def test_a_sendgrid_event_cannot_take_another_providers_id(client, signed, enqueued):
    """`ses:…`, `postmark:…` and `mailgun:…` ids are those providers' (app/web/provider_webhooks.py): a
    SendGrid event naming one is stored under its content hash, so it can never pre-empt theirs."""
    body = orjson.dumps([{"event": "open", "email": "a@example.com", "sg_event_id": "ses:9f3a:0"}])
    assert client.post("/webhooks/sendgrid", content=body, headers=signed(body)).status_code == 200
    ((sg_id,),) = db.query("SELECT sg_event_id FROM webhook_events")
    assert sg_id.startswith("sha256:")
