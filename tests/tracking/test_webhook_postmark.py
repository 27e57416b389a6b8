"""POST /webhooks/postmark: basic auth checked before the body is read, Postmark's records in the
webhook vocabulary, bounces and complaints suppressing every spelling, mails found by MessageID."""

from __future__ import annotations

import base64

import pytest

from app.platform import config, db
from tests import factories
from tests.provider_webhook_support import apply_all, event_count, mail_counts, stored, suppressed_under_every_spelling
from tracking import webhook_apply

USER, PASSWORD = "postmark", "s3cret-webhook-password"


@pytest.fixture
def configured(settings):
    settings(postmark_webhook_user=USER, postmark_webhook_password=PASSWORD)


@pytest.fixture
def enqueued(monkeypatch):
    calls: list = []
    monkeypatch.setattr(webhook_apply, "enqueue", lambda ids: calls.append(list(ids)))
    return calls


def basic(user: str = USER, password: str = PASSWORD) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def post(client, record: dict, headers: dict | None = None):
    return client.post("/webhooks/postmark", json=record, headers=basic() if headers is None else headers)


def bounce(email: str, kind: str = "HardBounce", bounce_id: int = 4323372036854775807, **extra) -> dict:
    return {
        "RecordType": "Bounce",
        "MessageStream": "outbound",
        "ID": bounce_id,
        "Type": kind,
        "TypeCode": 1,
        "Name": "Hard bounce",
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
        "Description": "The server was unable to deliver your message",
        "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
        "Email": email,
        "From": "notify@example.com",
        "BouncedAt": "2026-11-28T16:00:00Z",
        "Inactive": True,
        "CanActivate": True,
        **extra,
    }


def record(kind: str, recipient: str, message_id: str, **extra) -> dict:
    at = {"Delivery": "DeliveredAt", "Open": "ReceivedAt", "Click": "ReceivedAt", "SubscriptionChange": "ChangedAt"}
    return {
        "RecordType": kind,
        "MessageID": message_id,
        "Recipient": recipient,
        at[kind]: "2026-11-28T16:00:00Z",
        **extra,
    }


@pytest.mark.parametrize(
    "headers",
    [
        {},  # missing auth
        basic(password="wrong"),
        basic(user="other"),
        basic(password=PASSWORD + "x"),
        basic(password=""),
        {"Authorization": "Bearer " + PASSWORD},
        {"Authorization": "Basic not-base64!"},
        {"Authorization": "Basic " + base64.b64encode(PASSWORD.encode()).decode()},  # no user part
    ],
)
def test_wrong_or_missing_credentials_are_refused_before_any_row(client, configured, enqueued, headers):
    r = post(client, bounce("ana@example.com"), headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert event_count() == 0 and enqueued == []


def test_without_credentials_configured_the_route_is_not_there(client, settings):
    settings(postmark_webhook_user="", postmark_webhook_password="")
    r = post(client, bounce("ana@example.com"), basic("", ""))
    assert r.status_code == 404 and event_count() == 0


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"no": "RecordType"}'])
def test_malformed_bodies_are_400(client, configured, body):
    r = client.post("/webhooks/postmark", content=body, headers=basic())
    assert r.status_code == 400 and event_count() == 0


def test_a_hard_bounce_suppresses_every_spelling_and_a_redelivery_is_stored_once(client, configured, enqueued):
    factories.subscriber("ana", "Ana@Bücher.example")
    assert post(client, bounce("ANA@BÜCHER.EXAMPLE")).json() == {"stored": 1, "duplicates": 0}
    assert post(client, bounce("ANA@BÜCHER.EXAMPLE")).json() == {"stored": 0, "duplicates": 1}
    assert stored() == [("postmark:4323372036854775807", "bounce", "ANA@BÜCHER.EXAMPLE")]
    apply_all()
    assert suppressed_under_every_spelling("bounce")
    assert db.query("SELECT source FROM suppressions") == [("postmark:bounce",)]


@pytest.mark.parametrize("as_bounce_type", [False, True])
def test_a_spam_complaint_suppresses_every_spelling(client, configured, enqueued, as_bounce_type):
    complaint = bounce("ａｎａ@bücher.example", "SpamComplaint", TypeCode=100001)
    if not as_bounce_type:
        complaint["RecordType"] = "SpamComplaint"
    assert post(client, complaint).status_code == 200
    apply_all()
    assert suppressed_under_every_spelling("spamreport")


@pytest.mark.parametrize(
    "kind, event, reason",
    [
        ("Blocked", "bounce", "block"),
        ("BadEmailAddress", "bounce", "bounce"),
        ("ManuallyDeactivated", "bounce", "bounce"),
        ("Unsubscribe", "unsubscribe", "unsubscribe"),
        ("Transient", "deferred", None),
        ("SoftBounce", "deferred", None),
        ("DnsError", "deferred", None),
        ("AutoResponder", "bounce_other", None),
        ("DMARCPolicy", "bounce_other", None),
        ("SomethingNew", "bounce_other", None),
    ],
)
def test_bounce_types(client, configured, enqueued, kind, event, reason):
    factories.subscriber("ana", "ana@example.com")
    post(client, bounce("ana@example.com", kind))
    assert [r[1] for r in stored()] == [event]
    apply_all()
    assert db.query("SELECT reason FROM suppressions") == ([(reason,)] if reason else [])
    soft = 1 if event == "deferred" else 0
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(soft,)]


@pytest.mark.parametrize(
    "suppress, reason, expected",
    [(True, "ManualSuppression", "unsubscribe"), (True, "HardBounce", "bounce"), (False, "ManualSuppression", None)],
)
def test_a_subscription_change(client, configured, enqueued, suppress, reason, expected):
    post(
        client,
        record("SubscriptionChange", "ana@example.com", "m-1", SuppressSending=suppress, SuppressionReason=reason),
    )
    apply_all()
    assert db.query("SELECT reason FROM suppressions") == ([(expected,)] if expected else [])


def test_deliveries_opens_and_clicks_count_against_the_mail_with_that_message_id(client, configured, enqueued):
    ana = factories.subscriber("ana", "ana@example.com")
    nl = factories.newsletter_row()
    factories.outbox_row(nl, ana, provider_message_id="pm-nl-ana")
    run = factories.digest_run(ana, status="sent", provider_message_id="pm-digest-ana")
    for body in (
        record("Delivery", "Ana@Example.com", "pm-nl-ana"),
        record("Open", "ana@example.com", "pm-nl-ana", FirstOpen=True),
        record("Click", "ana@example.com", "pm-nl-ana", OriginalLink="https://example.com/x"),
        record("Delivery", "ana@example.com", "pm-digest-ana"),
        record("Delivery", "ana@example.com", "pm-digest-ana"),  # redelivered: the same record, stored once
        record("Open", "bob@example.com", "pm-digest-ana"),  # another address: counts for nobody
    ):
        assert post(client, body).status_code == 200
    assert event_count() == 5
    assert all(r[0].startswith("postmark:sha256:") for r in stored())
    apply_all()
    assert mail_counts() == {
        ("newsletter", nl, "delivered"): 1,
        ("newsletter", nl, "open"): 1,
        ("newsletter", nl, "click"): 1,
        ("digest", run, "delivered"): 1,
    }


def test_production_refuses_to_start_when_postmark_sends_without_credentials(settings):
    from app import web

    settings(env="production", secret_key="k" * 48, sendgrid_webhook_allow_unsigned=True, mail_provider="postmark")
    with pytest.raises(config.ConfigError, match="POSTMARK_WEBHOOK_USER and POSTMARK_WEBHOOK_PASSWORD"):
        web.create_app()
    settings(postmark_webhook_user=USER, postmark_webhook_password=PASSWORD)
    web.create_app()


def test_half_a_credential_is_a_start_up_error_everywhere(settings):
    from app import web

    settings(postmark_webhook_user=USER, postmark_webhook_password="")
    with pytest.raises(config.ConfigError, match="together"):
        web.create_app()


@pytest.mark.parametrize(
    "body",
    [
        {"RecordType": "Bounce", "Type": ["HardBounce"], "Email": ["a@x.test"], "ID": "7"},
        {"RecordType": "Bounce", "Type": "HardBounce", "Email": "a\u0000@x.test", "ID": 2**70},
        {"RecordType": "SubscriptionChange", "SuppressSending": True, "SuppressionReason": {"x": 1}},
        {"RecordType": "Click", "OriginalLink": 5, "MessageID": 5, "Recipient": None},
        {"RecordType": "Inbound", "From": "a@x.test"},
    ],
)
def test_odd_records_are_stored_or_skipped_never_an_error(client, configured, enqueued, body):
    r = post(client, body)
    assert r.status_code == 200, r.text
    apply_all()
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_through_the_real_server(live_server, configured, enqueued):
    """The app under uvicorn, credentials in the URL as Postmark is given them."""
    import httpx

    host = live_server.removeprefix("http://")
    with httpx.Client(timeout=30) as http:
        wrong = http.post(f"http://{USER}:nope@{host}/webhooks/postmark", json=bounce("ana@example.com"))
        assert wrong.status_code == 401
        right = http.post(f"http://{USER}:{PASSWORD}@{host}/webhooks/postmark", json=bounce("ana@example.com"))
        assert right.json() == {"stored": 1, "duplicates": 0}
    assert event_count() == 1


def test_the_reference_example_is_what_the_route_takes(client, configured, enqueued):
    op = client.get("/openapi.json").json()["paths"]["/webhooks/postmark"]["post"]
    example = op["requestBody"]["content"]["application/json"]["example"]
    r = post(client, example)
    assert r.status_code == 200 and r.json() == op["responses"]["200"]["content"]["application/json"]["example"]
