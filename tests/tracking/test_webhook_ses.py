"""POST /webhooks/ses: Amazon SNS messages signed by a certificate the test makes (v1 SHA1, v2 SHA256),
every forgery refused before a row is written, SES bounces and complaints suppressing every spelling,
subscriptions confirmed on a local server, mails found by SES's message id."""

from __future__ import annotations

import pytest

from app.platform import config, db
from tests import factories
from tests.provider_webhook_support import (
    CERT_URL,
    SUBSCRIBE_URL,
    TOPIC,
    LocalServer,
    SigningKey,
    ToLocal,
    apply_all,
    event_count,
    mail_counts,
    notification,
    ses_event,
    sign,
    sns_time,
    stored,
    string_to_sign,
    subscription_confirmation,
    suppressed_under_every_spelling,
)
from tracking import sns, webhook_apply


@pytest.fixture(scope="module")
def signing_key() -> SigningKey:
    return SigningKey()


@pytest.fixture
def pinned(settings, signing_key, tmp_path):
    """The certificate pinned by SNS_SIGNING_CERT_FILE, the test topic allowed."""
    path = tmp_path / "sns.pem"
    path.write_bytes(signing_key.pem)
    settings(ses_sns_topic_arns=(TOPIC,), sns_signing_cert_file=str(path), sns_max_age_seconds=3900)
    return path


@pytest.fixture
def enqueued(monkeypatch):
    """The worker hint after commit, kept here (the tests apply the rows themselves)."""
    calls: list = []
    monkeypatch.setattr(webhook_apply, "enqueue", lambda ids: calls.append(list(ids)))
    return calls


@pytest.fixture
def local_sns():
    """A local server standing in for SNS's hosts (certificates, SubscribeURL); requests for checked
    SNS URLs reach it through tracking/sns.py's transport seam, and nothing else does."""
    saved = sns.transport
    sns._certificates.clear()
    with LocalServer() as server:
        sns.transport = ToLocal(server)
        try:
            yield server
        finally:
            sns.transport = saved
            sns._certificates.clear()


def post(client, message: dict):
    return client.post(
        "/webhooks/ses",
        json=message,
        headers={"x-amz-sns-message-type": str(message.get("Type")), "Content-Type": "text/plain; charset=UTF-8"}
        if isinstance(message.get("Type"), str)
        else {},
    )


# -- the certificate URL rule, as production has it ------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
        "https://sns.us-gov-west-1.amazonaws.com/x.pem",
    ],
)
def test_sns_certificate_urls_accepted(url):
    assert sns.check_sns_url(url, "SigningCertURL", pem=True) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",  # not https
        "https://s3.amazonaws.com/sns.us-east-1.amazonaws.com/cert.pem",  # anyone can publish on S3
        "https://sns.evil.example/SimpleNotificationService-abc.pem",
        "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
        "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com@evil.example/x.pem",
        "https://user@sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com:8443/x.pem",
        "https://SNS.US-EAST-1.AMAZONAWS.COM.evil.example/x.pem",
        "https://sns.us-east-1.amazonaws.com/x.pem.txt",
        "https://sns.us-east-1.amazonaws.com/x.pem?x=1",
        "https://sns..amazonaws.com/x.pem",
        "file:///etc/passwd.pem",
        "https://sns.us-east-1.amazonaws.com/x.txt",
    ],
)
def test_sns_certificate_urls_refused(url):
    with pytest.raises(sns.SnsError):
        sns.check_sns_url(url, "SigningCertURL", pem=True)


# -- refused before any row -----------------------------------------------------------------------


def _forged(case: str, key: SigningKey) -> dict:
    bounce = ses_event("Bounce", ["ana@example.com"])
    if case == "http_cert_url":
        return sign(key, notification(bounce, SigningCertURL=CERT_URL.replace("https:", "http:")))
    if case == "s3_cert_url":
        return sign(key, notification(bounce, SigningCertURL="https://s3.amazonaws.com/bucket/cert.pem"))
    if case == "evil_cert_url":
        return sign(key, notification(bounce, SigningCertURL="https://sns.evil.example/cert.pem"))
    if case == "changed_message":
        signed = sign(key, notification(bounce), "2")
        return {**signed, "Message": signed["Message"].replace("ana@", "bob@")}
    if case == "old_timestamp":
        return sign(key, notification(bounce, Timestamp=sns_time(3901)))
    if case == "future_timestamp":
        return sign(key, notification(bounce, Timestamp=sns_time(-600)))
    if case == "unknown_topic":
        return sign(key, notification(bounce, TopicArn="arn:aws:sns:eu-west-1:999999999999:someone-else"))
    if case == "other_key":
        return sign(SigningKey(), notification(bounce))
    if case == "sha1_claimed_as_v2":
        return {**sign(key, notification(bounce), "1"), "SignatureVersion": "2"}
    if case == "unknown_version":
        return {**sign(key, notification(bounce)), "SignatureVersion": "3"}
    if case == "no_signature":
        return notification(bounce, SignatureVersion="1")
    if case == "subject_added":
        return {**sign(key, notification(bounce)), "Subject": "added later"}
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "http_cert_url",
        "s3_cert_url",
        "evil_cert_url",
        "changed_message",
        "old_timestamp",
        "future_timestamp",
        "unknown_topic",
        "other_key",
        "sha1_claimed_as_v2",
        "unknown_version",
        "no_signature",
        "subject_added",
    ],
)
def test_forged_or_stale_messages_are_refused_before_any_row(client, pinned, signing_key, enqueued, case):
    factories.subscriber("ana", "ana@example.com")
    before = event_count()
    r = post(client, _forged(case, signing_key))
    assert r.status_code == 403, r.text
    assert r.json()["error"] == "bad_signature"
    assert event_count() == before == 0 and enqueued == []


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"x"', b'{"Type": "Notification"}'])
def test_malformed_bodies_are_refused(client, pinned, body):
    r = client.post("/webhooks/ses", content=body)
    assert r.status_code in (400, 403) and event_count() == 0


def test_without_topics_the_route_is_not_there(client, settings, signing_key):
    settings(ses_sns_topic_arns=())
    r = post(client, sign(signing_key, notification(ses_event("Bounce", ["ana@example.com"]))))
    assert r.status_code == 404 and r.json()["error"] == "not_configured"
    assert event_count() == 0


# -- accepted -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1", "2"])
@pytest.mark.parametrize("fmt", ["eventType", "notificationType"])
def test_a_bounce_suppresses_every_spelling(client, pinned, signing_key, enqueued, version, fmt):
    factories.subscriber("ana", "Ana@Bücher.example")
    event = ses_event("Bounce", ["ANA@XN--BCHER-KVA.EXAMPLE"])
    if fmt == "notificationType":  # an identity notification: the same objects, another key
        event["notificationType"] = event.pop("eventType")
    r = post(client, sign(signing_key, notification(event), version))
    assert r.status_code == 200 and r.json() == {"stored": 1, "duplicates": 0}
    assert stored() == [("ses:9f3a1c2e-0000-4000-8000-000000000001:0", "bounce", "ANA@XN--BCHER-KVA.EXAMPLE")]
    assert apply_all() == 1
    assert suppressed_under_every_spelling("bounce")


def test_a_complaint_suppresses_every_spelling(client, pinned, signing_key, enqueued):
    r = post(client, sign(signing_key, notification(ses_event("Complaint", ["ａｎａ@bücher.example"])), "2"))
    assert r.json() == {"stored": 1, "duplicates": 0}
    apply_all()
    assert suppressed_under_every_spelling("spamreport")
    assert db.query("SELECT source FROM suppressions") == [("ses:spamreport",)]


def test_a_transient_bounce_is_a_soft_bounce(client, pinned, signing_key, enqueued, settings):
    settings(soft_bounce_limit=2)
    sid = factories.subscriber("ana", "ana@example.com")
    for n in range(2):
        event = ses_event("Bounce", ["ana@example.com"], bounceType="Transient", bounceSubType="MailboxFull")
        post(client, sign(signing_key, notification(event, message_id=f"soft-{n}")))
        apply_all()
    assert db.query("SELECT soft_bounce_count FROM subscribers WHERE id = %s", (sid,)) == [(2,)]
    assert db.query("SELECT email, reason FROM suppressions") == [("ana@example.com", "soft_bounce")]


def test_one_bounce_for_several_recipients_is_a_row_each_and_a_redelivery_is_stored_once(
    client, pinned, signing_key, enqueued
):
    message = sign(signing_key, notification(ses_event("Bounce", ["a@example.com", "b@example.com"])), "2")
    assert post(client, message).json() == {"stored": 2, "duplicates": 0}
    assert post(client, message).json() == {"stored": 0, "duplicates": 2}  # SNS delivering it again
    rows = stored()
    assert [r[0].rsplit(":", 1)[1] for r in rows] == ["0", "1"] and [r[2] for r in rows] == [
        "a@example.com",
        "b@example.com",
    ]
    # Each recipient's row names only its own recipient (an erasure of one deletes nothing of the other).
    payloads = [p for (p,) in db.query("SELECT payload FROM webhook_events ORDER BY sg_event_id")]
    assert [[r["emailAddress"] for r in p["raw"]["bounce"]["bouncedRecipients"]] for p in payloads] == [
        ["a@example.com"],
        ["b@example.com"],
    ]
    assert [p["raw"]["mail"]["destination"] for p in payloads] == [["a@example.com"], ["b@example.com"]]
    apply_all()
    assert db.query("SELECT email FROM suppressions ORDER BY email") == [("a@example.com",), ("b@example.com",)]


def test_deliveries_and_opens_count_against_the_mail_with_that_message_id(client, pinned, signing_key, enqueued):
    ana = factories.subscriber("ana", "Ana@Example.com")
    bob = factories.subscriber("bob", "bob@example.com")
    nl = factories.newsletter_row()
    factories.outbox_row(nl, ana, provider_message_id="ses-nl-ana")
    factories.outbox_row(nl, bob, provider_message_id="ses-nl-bob")
    run = factories.digest_run(ana, status="sent", provider_message_id="ses-digest-ana")
    messages = [
        ("m1", ses_event("Delivery", ["ana@example.com"], message_id="ses-nl-ana")),
        ("m2", ses_event("Open", ["ana@example.com"], message_id="ses-nl-ana")),
        ("m3", ses_event("Delivery", ["ana@example.com"], message_id="ses-digest-ana")),
        # bob's mail id with ana's address: counts for nobody (the address decides)
        ("m4", ses_event("Delivery", ["ana@example.com"], message_id="ses-nl-bob")),
        ("m5", ses_event("Delivery", ["nobody@example.com"], message_id="unknown-id")),
    ]
    for message_id, event in messages:
        assert post(client, sign(signing_key, notification(event, message_id=message_id))).status_code == 200
    apply_all()
    assert mail_counts() == {
        ("newsletter", nl, "delivered"): 1,
        ("newsletter", nl, "open"): 1,
        ("digest", run, "delivered"): 1,
    }


def test_a_subscription_confirmation_of_an_allowed_topic_is_confirmed(client, pinned, signing_key, local_sns):
    local_sns.httpd.files["/"] = b"<ConfirmSubscriptionResponse/>"
    r = post(client, sign(signing_key, subscription_confirmation(), "2"))
    assert r.status_code == 200, r.text
    path = SUBSCRIBE_URL.split("amazonaws.com", 1)[1]
    assert local_sns.requests == [(path, "sns.eu-west-1.amazonaws.com")]
    assert event_count() == 0


def test_a_confirmation_sns_does_not_take_is_a_502_so_sns_sends_it_again(client, pinned, signing_key, local_sns):
    r = post(client, sign(signing_key, subscription_confirmation(), "2"))  # the local server answers 404
    assert r.status_code == 502 and len(local_sns.requests) == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"TopicArn": "arn:aws:sns:eu-west-1:999999999999:someone-else"},
        {"SubscribeURL": "https://evil.example/?Action=ConfirmSubscription"},
        {"SubscribeURL": "http://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription"},
    ],
)
def test_a_subscription_confirmation_is_not_followed_unless_allowed_and_on_sns(
    client, pinned, signing_key, local_sns, fields
):
    r = post(client, sign(signing_key, subscription_confirmation(**fields), "2"))
    assert r.status_code == 403
    assert local_sns.requests == []


def test_the_certificate_is_fetched_once_from_its_checked_url(client, settings, signing_key, local_sns, enqueued):
    settings(ses_sns_topic_arns=(TOPIC,), sns_signing_cert_file="")
    local_sns.httpd.files[CERT_URL.split("amazonaws.com", 1)[1]] = signing_key.pem
    for n in range(3):
        event = ses_event("Delivery", ["ana@example.com"])
        assert post(client, sign(signing_key, notification(event, message_id=f"d-{n}"), "2")).status_code == 200
    assert local_sns.requests == [(CERT_URL.split("amazonaws.com", 1)[1], "sns.eu-west-1.amazonaws.com")]
    assert event_count() == 3
    # The same transport never carries a URL the rule refuses: nothing is fetched for these.
    for url in ("http://sns.eu-west-1.amazonaws.com/x.pem", "https://s3.amazonaws.com/x.pem"):
        message = sign(signing_key, notification(ses_event("Delivery", ["a@x.test"]), SigningCertURL=url))
        assert post(client, message).status_code == 403
    assert len(local_sns.requests) == 1


def test_a_certificate_that_cannot_be_fetched_refuses_the_message(client, settings, signing_key, local_sns):
    settings(ses_sns_topic_arns=(TOPIC,), sns_signing_cert_file="")  # the server has no such file: 404
    r = post(client, sign(signing_key, notification(ses_event("Delivery", ["a@x.test"]))))
    assert r.status_code == 403 and event_count() == 0


def test_production_refuses_to_start_when_ses_sends_without_topics(settings):
    from app import web

    settings(
        env="production",
        secret_key="k" * 48,
        sendgrid_webhook_allow_unsigned=True,
        mail_provider="ses",
        ses_sns_topic_arns=(),
    )
    with pytest.raises(config.ConfigError, match="SES_SNS_TOPIC_ARNS"):
        web.create_app()
    settings(ses_sns_topic_arns=(TOPIC,))
    assert "/webhooks/ses" in [route.path for route in web.create_app().routes]


def test_an_unreadable_pinned_certificate_file_is_a_start_up_error(settings, tmp_path):
    from app import web

    settings(sns_signing_cert_file=str(tmp_path / "missing.pem"))
    with pytest.raises(config.ConfigError, match="SNS_SIGNING_CERT_FILE"):
        web.create_app()
    (tmp_path / "junk.pem").write_text("not a certificate")
    settings(sns_signing_cert_file=str(tmp_path / "junk.pem"))
    with pytest.raises(config.ConfigError, match="SNS_SIGNING_CERT_FILE"):
        web.create_app()


def test_the_string_to_sign_is_awss(signing_key):
    """The code's string equals the one written out from AWS's documentation (tests/provider_webhook_support.py)."""
    for message in (
        notification(ses_event("Bounce", ["a@x.test"])),
        notification(ses_event("Bounce", ["a@x.test"]), Subject="Amazon SES Email Event Notification"),
        subscription_confirmation(),
    ):
        assert sns.string_to_sign(message) == string_to_sign(message)


@pytest.mark.parametrize(
    "fields",
    [
        {"SignatureVersion": ["1"]},
        {"Type": ["Notification"]},
        {"SigningCertURL": "https://[::1/x.pem"},
        {"SigningCertURL": 5},
        {"Timestamp": "yesterday"},
        {"Signature": "not base64!"},
        {"Signature": "é" * 10},
        {"Message": {"eventType": "Bounce"}},
        {"TopicArn": [TOPIC]},
    ],
)
def test_hostile_fields_are_refused_not_errors(client, pinned, signing_key, fields):
    message = {**sign(signing_key, notification(ses_event("Bounce", ["a@x.test"]))), **fields}
    assert post(client, message).status_code == 403 and event_count() == 0


@pytest.mark.parametrize(
    "event",
    [
        {"eventType": ["Bounce"], "mail": {}},
        {
            "eventType": "Bounce",
            "mail": {"messageId": 5},
            "bounce": {"bouncedRecipients": [5, None, {"emailAddress": 7}]},
        },
        {"eventType": "Bounce", "mail": {}, "bounce": {"bounceType": ["Permanent"], "bouncedRecipients": ["a@x.test"]}},
        {"eventType": "Delivery", "mail": {"destination": "a@x.test"}, "delivery": "x"},
        {"notificationType": "AmazonSnsSubscriptionSucceeded", "message": "You have successfully subscribed"},
        [1, 2],
    ],
)
def test_odd_ses_events_are_stored_or_skipped_never_an_error(client, pinned, signing_key, enqueued, event):
    import orjson

    message = notification({}, Message=orjson.dumps(event).decode())
    r = post(client, sign(signing_key, message))
    assert r.status_code == 200, r.text
    apply_all()
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL") == [(0,)]


def test_a_notification_that_is_not_an_ses_event_is_answered_and_stores_nothing(client, pinned, signing_key):
    r = post(client, sign(signing_key, notification({}, Message="Hello from the SNS console")))
    assert r.json() == {"stored": 0, "duplicates": 0}


def test_through_the_real_server(live_server, pinned, signing_key, enqueued):
    """The app under uvicorn: a v2 bounce stored, its forgery (another Message) refused."""
    import httpx

    message = sign(signing_key, notification(ses_event("Bounce", ["ana@example.com"])), "2")
    with httpx.Client(base_url=live_server, timeout=30) as http:
        forged = {**message, "Message": message["Message"].replace("ana@", "bob@")}
        assert http.post("/webhooks/ses", json=forged).status_code == 403
        assert http.post("/webhooks/ses", json=message).json() == {"stored": 1, "duplicates": 0}
    assert [r[2] for r in stored()] == ["ana@example.com"]


def test_an_expired_certificate_is_never_used(client, settings, local_sns, tmp_path):
    from app import web

    old = SigningKey(expired=True)
    (tmp_path / "old.pem").write_bytes(old.pem)
    settings(ses_sns_topic_arns=(TOPIC,), sns_signing_cert_file=str(tmp_path / "old.pem"))
    with pytest.raises(config.ConfigError, match="no RSA certificate valid now"):
        web.create_app()
    settings(sns_signing_cert_file="")  # fetched: refused the same way
    local_sns.httpd.files[CERT_URL.split("amazonaws.com", 1)[1]] = old.pem
    r = post(client, sign(old, notification(ses_event("Delivery", ["a@x.test"]))))
    assert r.status_code == 403 and "valid now" in r.json()["message"] and event_count() == 0


def test_an_unsubscribe_confirmation_is_verified_answered_and_not_followed(client, pinned, signing_key, local_sns):
    message = subscription_confirmation(Type="UnsubscribeConfirmation", Message="You have unsubscribed")
    assert post(client, sign(signing_key, message, "1")).json() == {"stored": 0, "duplicates": 0}
    forged = {**sign(signing_key, message, "1"), "Message": "something else"}
    assert post(client, forged).status_code == 403
    assert local_sns.requests == [] and event_count() == 0


def test_the_reference_example_signed_now_is_what_the_route_takes(client, pinned, signing_key, enqueued):
    """The API reference's example (shown with a placeholder signature), given a fresh Timestamp and a
    real signature, gets the answer the reference shows."""
    op = client.get("/openapi.json").json()["paths"]["/webhooks/ses"]["post"]
    example = op["requestBody"]["content"]["application/json"]["example"]
    shown = op["responses"]["200"]["content"]["application/json"]["example"]
    assert post(client, example).status_code == 403  # as shown: not signed by anyone
    r = post(client, sign(signing_key, {**example, "Timestamp": sns_time()}, example["SignatureVersion"]))
    assert r.status_code == 200 and r.json() == shown


def test_delivery_delays_are_stored_but_only_the_bounce_that_ends_them_is_a_soft_bounce(
    client, pinned, signing_key, enqueued
):
    factories.subscriber("ana", "ana@example.com")
    delay = ses_event("Delivery", ["ana@example.com"])
    delay["eventType"] = "DeliveryDelay"
    delay["deliveryDelay"] = {
        "delayType": "MailboxFull",
        "delayedRecipients": [{"emailAddress": "ana@example.com", "status": "4.2.2"}],
    }
    for n in range(3):  # SES saying so again
        post(client, sign(signing_key, notification(delay, message_id=f"delay-{n}")))
    apply_all()
    assert [r[1] for r in stored()] == ["deferred"] * 3
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(0,)]
    given_up = ses_event("Bounce", ["ana@example.com"], bounceType="Transient", bounceSubType="MailboxFull")
    post(client, sign(signing_key, notification(given_up, message_id="bounce-1")))
    apply_all()
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(1,)]
