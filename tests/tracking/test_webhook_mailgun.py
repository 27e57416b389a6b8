"""POST /webhooks/mailgun: the HMAC-SHA256 signature, its age, each token once (real Redis), Mailgun's
events in the webhook vocabulary, bounces and complaints suppressing every spelling, mails found by
message-id (one shared by a batch send)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import pytest
import redis as redis_lib

from app.operations import erasure
from app.operations.audit import Operator
from app.platform import config, db, queue
from tests import factories
from tests.provider_webhook_support import apply_all, event_count, mail_counts, stored, suppressed_under_every_spelling
from tracking import webhook_apply

KEY = "key-0123456789abcdef0123456789abcdef"


@pytest.fixture
def configured(settings, redis_client):
    settings(mailgun_webhook_signing_key=KEY, mailgun_webhook_max_age_seconds=900)
    return redis_client


@pytest.fixture
def enqueued(monkeypatch):
    calls: list = []
    monkeypatch.setattr(webhook_apply, "enqueue", lambda ids: calls.append(list(ids)))
    return calls


def signed(event: dict, key: str = KEY, timestamp: int | None = None, token: str | None = None) -> dict:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    token = token or secrets.token_hex(25)
    signature = hmac.new(key.encode(), (ts + token).encode(), hashlib.sha256).hexdigest()
    return {"signature": {"timestamp": ts, "token": token, "signature": signature}, "event-data": event}


def event(kind: str, recipient: str, event_id: str = "CPgfbmQMTCKtHW6uIWtuVe", message_id: str = "mg-1", **extra):
    return {
        "id": event_id,
        "event": kind,
        "timestamp": time.time(),
        "recipient": recipient,
        "message": {"headers": {"message-id": message_id, "to": recipient, "subject": "Hi"}},
        **extra,
    }


def failed(recipient: str, severity: str = "permanent", **extra) -> dict:
    fields = {
        "severity": severity,
        "reason": "bounce" if severity == "permanent" else "generic",
        "delivery-status": {"code": 550, "attempt-no": 1, "message": "No such user"},
        **extra,
    }
    return event("failed", recipient, **fields)


def post(client, body: dict):
    return client.post("/webhooks/mailgun", json=body)


@pytest.mark.parametrize("case", ["bad_signature", "other_key", "old", "future", "no_signature", "token_changed"])
def test_forged_or_stale_requests_are_refused_before_any_row(client, configured, enqueued, case):
    body = signed(failed("ana@example.com"))
    if case == "bad_signature":
        body["signature"]["signature"] = "0" * 64
    elif case == "other_key":
        body = signed(failed("ana@example.com"), key="another-key")
    elif case == "old":
        body = signed(failed("ana@example.com"), timestamp=int(time.time()) - 901)
    elif case == "future":
        body = signed(failed("ana@example.com"), timestamp=int(time.time()) + 901)
    elif case == "no_signature":
        del body["signature"]
    elif case == "token_changed":
        body["signature"]["token"] = secrets.token_hex(25)
    r = post(client, body)
    assert r.status_code == 403 and r.json()["error"] == "bad_signature"
    assert event_count() == 0 and enqueued == []
    assert configured.keys("notify:mailgun:token:*") == []  # a forged request marks no token used


def test_a_replayed_token_is_refused(client, configured, enqueued):
    body = signed(failed("ana@example.com"))
    assert post(client, body).json() == {"stored": 1, "duplicates": 0}
    replay = post(client, body)
    assert replay.status_code == 403 and "already used" in replay.json()["message"]
    # The same token with another (validly signed) event is refused too.
    timestamp, token = int(body["signature"]["timestamp"]), body["signature"]["token"]
    other = signed(failed("bob@example.com", event_id="other"), timestamp=timestamp, token=token)
    assert post(client, other).status_code == 403
    assert event_count() == 1
    ttl = configured.ttl(configured.keys("notify:mailgun:token:*")[0])
    assert 0 < ttl <= 900  # remembered only as long as the age bound would not refuse it anyway


def test_a_redelivered_event_with_a_new_token_is_stored_once(client, configured, enqueued):
    assert post(client, signed(failed("ana@example.com"))).json() == {"stored": 1, "duplicates": 0}
    assert post(client, signed(failed("ana@example.com"))).json() == {"stored": 0, "duplicates": 1}
    assert stored() == [("mailgun:CPgfbmQMTCKtHW6uIWtuVe", "bounce", "ana@example.com")]


def test_without_redis_the_request_is_refused_with_503_not_accepted(client, configured, enqueued, monkeypatch):
    broker = queue.broker()
    monkeypatch.setattr(broker, "client", redis_lib.Redis(port=1, socket_connect_timeout=0.5))
    r = post(client, signed(failed("ana@example.com")))
    assert r.status_code == 503 and r.headers["retry-after"]
    assert event_count() == 0


def test_without_a_signing_key_the_route_is_not_there(client, settings):
    settings(mailgun_webhook_signing_key="")
    assert post(client, signed(failed("ana@example.com"), key="")).status_code == 404
    assert event_count() == 0


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"x"'])
def test_malformed_bodies_are_refused(client, configured, body):
    r = client.post("/webhooks/mailgun", content=body)
    assert r.status_code in (400, 403) and event_count() == 0


def test_a_permanent_failure_suppresses_every_spelling(client, configured, enqueued):
    factories.subscriber("ana", "Ana@Bücher.example")
    assert post(client, signed(failed("ANA@XN--BCHER-KVA.EXAMPLE"))).status_code == 200
    apply_all()
    assert suppressed_under_every_spelling("bounce")
    assert db.query("SELECT source FROM suppressions") == [("mailgun:bounce",)]


def test_a_complaint_suppresses_every_spelling(client, configured, enqueued):
    assert post(client, signed(event("complained", "ａｎａ@bücher.example"))).status_code == 200
    apply_all()
    assert suppressed_under_every_spelling("spamreport")


@pytest.mark.parametrize(
    "body, name, reason",
    [
        (event("unsubscribed", "ana@example.com"), "unsubscribe", "unsubscribe"),
        (failed("ana@example.com", reason="suppress-complaint"), "spamreport", "spamreport"),
        (failed("ana@example.com", reason="espblock"), "bounce", "block"),
        (failed("ana@example.com", "temporary"), "deferred", None),
        (event("delivered", "ana@example.com"), "delivered", None),
        (event("opened", "ana@example.com"), "open", None),
        (event("clicked", "ana@example.com", url="https://example.com/x"), "click", None),
    ],
)
def test_events(client, configured, enqueued, body, name, reason):
    factories.subscriber("ana", "ana@example.com")
    post(client, signed(body))
    assert [r[1] for r in stored()] == [name]
    apply_all()
    assert db.query("SELECT reason FROM suppressions") == ([(reason,)] if reason else [])


def test_temporary_failures_count_once_per_message(client, configured, enqueued, settings):
    settings(soft_bounce_limit=10)
    factories.subscriber("ana", "ana@example.com")
    for attempt in (1, 2, 3):  # Mailgun's own retries of one message
        body = failed("ana@example.com", "temporary", id=f"t-{attempt}")
        body["delivery-status"]["attempt-no"] = attempt
        post(client, signed(body))
    apply_all()
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(1,)]


def test_events_count_against_the_mail_sent_to_their_address(client, configured, enqueued):
    """A batch send shares one message-id across its recipients: the recipient picks the row."""
    ana = factories.subscriber("ana", "ana@example.com")
    bob = factories.subscriber("bob", "bob@example.com")
    nl = factories.newsletter_row()
    factories.outbox_row(nl, ana, provider_message_id="batch-1@mg.example.com")
    factories.outbox_row(nl, bob, provider_message_id="batch-1@mg.example.com")
    run = factories.digest_run(ana, status="sent", provider_message_id="digest-1@mg.example.com")
    for n, (kind, recipient, message_id) in enumerate(
        [
            ("delivered", "ana@example.com", "<batch-1@mg.example.com>"),  # angle brackets dropped
            ("delivered", "Bob@Example.com", "batch-1@mg.example.com"),
            ("opened", "ana@example.com", "batch-1@mg.example.com"),
            ("delivered", "ana@example.com", "digest-1@mg.example.com"),
            ("delivered", "eve@example.com", "digest-1@mg.example.com"),  # not the run's address
        ]
    ):
        assert post(client, signed(event(kind, recipient, f"e-{n}", message_id))).status_code == 200
    apply_all()
    assert mail_counts() == {
        ("newsletter", nl, "delivered"): 2,
        ("newsletter", nl, "open"): 1,
        ("digest", run, "delivered"): 1,
    }


def test_production_refuses_to_start_when_mailgun_sends_without_a_signing_key(settings):
    from app import web

    settings(env="production", secret_key="k" * 48, sendgrid_webhook_allow_unsigned=True, mail_provider="mailgun")
    with pytest.raises(config.ConfigError, match="MAILGUN_WEBHOOK_SIGNING_KEY"):
        web.create_app()
    settings(mailgun_webhook_signing_key=KEY)
    web.create_app()
    settings(mail_provider="smtp", mailgun_webhook_signing_key="")  # not in use: not required
    web.create_app()


@pytest.mark.parametrize(
    "body",
    [
        {"signature": {"timestamp": "１７００", "token": "t", "signature": "x"}, "event-data": {}},
        {"signature": {"timestamp": str(int(time.time())), "token": "t", "signature": "é" * 64}, "event-data": {}},
        {"signature": {"timestamp": [1], "token": {}, "signature": None}},
        {"signature": "x", "event-data": []},
        {"signature": {"timestamp": True, "token": "t", "signature": "s"}},
    ],
)
def test_hostile_signatures_are_refused_not_errors(client, configured, body):
    assert post(client, body).status_code == 403 and event_count() == 0


@pytest.mark.parametrize(
    "data",
    [
        {"event": ["failed"], "recipient": "a@x.test"},
        {"event": "failed", "severity": ["permanent"], "reason": {"x": 1}, "recipient": ["a@x.test"]},
        {"event": "clicked", "url": 5, "message": "not an object", "id": 7},
        {"event": "failed", "severity": "temporary", "delivery-status": {"attempt-no": [1]}, "recipient": "a@x.test"},
        {"event": "delivered", "recipient": "a\u0000@x.test", "message": {"headers": {"message-id": ["x"]}}},
    ],
)
def test_odd_event_data_is_stored_or_skipped_never_an_error(client, configured, enqueued, data):
    r = post(client, signed(data))
    assert r.status_code == 200, r.text
    apply_all()
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_through_the_real_server(live_server, configured, enqueued):
    """The app under uvicorn: a signed event stored, the same request again refused as a replay."""
    import httpx

    body = signed(event("complained", "ana@example.com"))
    with httpx.Client(base_url=live_server, timeout=30) as http:
        assert http.post("/webhooks/mailgun", json=body).json() == {"stored": 1, "duplicates": 0}
        assert http.post("/webhooks/mailgun", json=body).status_code == 403
    assert event_count() == 1


def test_an_erasure_deletes_the_events_about_the_address_and_later_ones_are_not_kept(client, configured, enqueued):
    """Mailgun reports on mail sent before an erasure for weeks: such an event still suppresses
    (the address is kept suppressed as erased) and is not kept once applied."""
    factories.subscriber("ana", "Ana@Bücher.example")
    post(client, signed(event("delivered", "ANA@BÜCHER.EXAMPLE", "before")))
    post(client, signed(event("delivered", "bo@example.com", "other")))
    apply_all()
    assert erasure.erase_subscriber("ana", Operator("test"))
    assert [r[2] for r in stored()] == ["bo@example.com"]
    post(client, signed(event("opened", "ana@xn--bcher-kva.example", "after")))
    apply_all()
    assert [r[2] for r in stored()] == ["bo@example.com"]
    assert db.query("SELECT email, reason FROM suppressions") == [("ana@xn--bcher-kva.example", "erased")]


def test_the_production_web_process_does_not_start_without_the_webhook_secret_of_a_provider_in_use():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILGUN_", "SENDGRID_", "MAIL_PROVIDER"))}
    env.update(
        APP_ENV="production",
        ENV_FILE="",
        SECRET_KEY="k" * 48,
        SENDGRID_WEBHOOK_ALLOW_UNSIGNED=config.ALLOW_UNSIGNED_WEBHOOK,
        MAIL_POSTAL_ADDRESS="Example Ltd, 1 Main St, Springfield",
        MAIL_PROVIDER="mailgun",
    )

    def run():
        return subprocess.run(
            [sys.executable, "-c", "import app.web"], env=env, capture_output=True, text=True, timeout=60
        )

    proc = run()
    assert proc.returncode != 0 and "MAILGUN_WEBHOOK_SIGNING_KEY" in proc.stderr, proc.stderr[-2000:]
    env["MAILGUN_WEBHOOK_SIGNING_KEY"] = KEY
    proc = run()
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_reference_example_signed_now_is_what_the_route_takes(client, configured, enqueued):
    op = client.get("/openapi.json").json()["paths"]["/webhooks/mailgun"]["post"]
    example = op["requestBody"]["content"]["application/json"]["example"]
    assert post(client, example).status_code == 403  # as shown: signed long ago, with another key
    r = post(client, signed(example["event-data"]))
    assert r.status_code == 200 and r.json() == op["responses"]["200"]["content"]["application/json"]["example"]
