"""POST /v1/newsletters/{id}/test: a few addresses get the newsletter now, the outbox never hears of it."""

from __future__ import annotations

import pytest

from app.platform import db
from tests import factories
from tests.conftest import auth
from tests.digest_support import sink_as_provider


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings, tracking=True) as s:
        yield s


def _test(client, key, newsletter_id, body):
    return client.post(f"/v1/newsletters/{newsletter_id}/test", json=body, headers=auth(key))


def test_a_draft_goes_to_the_given_addresses_and_never_touches_the_outbox(client, admin_key, sink):
    factories.subscriber("ana", email="Ana@Example.test", name="Ana Lima")
    nl = factories.newsletter(
        subject="Hello {{name}}",
        html='<p>Hi {{name}} <a href="https://example.com/x">x</a> <a href="{{unsubscribe_url}}">stop</a></p>',
    )
    answer = _test(client, admin_key, nl, {"to": ["ana@example.test", "Editor@Example.test", "editor@example.test"]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "id": nl,
        "results": [
            {"email": "ana@example.test", "status": "sent"},
            {"email": "editor@example.test", "status": "sent"},
        ],
    }
    by_rcpt = {m["To"].addresses[0].addr_spec.lower(): m for m in sink.messages()}
    assert sorted(by_rcpt) == ["ana@example.test", "editor@example.test"]
    ana, editor = by_rcpt["ana@example.test"], by_rcpt["editor@example.test"]
    assert ana["Subject"] == "[Test] Hello Ana Lima"
    assert "List-Unsubscribe" in ana  # the subscriber's own, working link
    assert "List-Unsubscribe" not in editor  # no subscriber behind it: nothing to stop
    body = editor.get_body(("html",)).get_content()
    assert 'href="https://example.com/x"' in body  # not tracked: the statistics stay the audience's
    assert "/u/test-send" in body
    assert db.query("SELECT count(*) FROM email_log")[0][0] == 0
    assert db.query("SELECT status FROM newsletters WHERE id = %s", (nl,))[0][0] == "draft"
    assert db.query("SELECT count(*) FROM email_links")[0][0] == 0


def test_suppressed_addresses_are_refused_and_the_rest_sent(client, admin_key, sink):
    factories.suppression("bounced@example.test")
    nl = factories.newsletter()
    answer = _test(client, admin_key, nl, {"to": ["bounced@example.test", "ok@example.test"]})
    assert answer.json()["results"] == [
        {"email": "bounced@example.test", "status": "suppressed"},
        {"email": "ok@example.test", "status": "sent"},
    ]
    assert [m["To"].addresses[0].addr_spec for m in sink.messages()] == ["ok@example.test"]


def test_a_refused_recipient_is_failed_alone(client, admin_key, sink):
    sink.reject_rcpt.add("no@example.test")
    nl = factories.newsletter()
    results = _test(client, admin_key, nl, {"to": ["no@example.test", "yes@example.test"]}).json()["results"]
    assert results[0]["email"] == "no@example.test" and results[0]["status"] == "failed" and results[0]["error"]
    assert results[1] == {"email": "yes@example.test", "status": "sent"}


def test_provider_down_is_503_and_nothing_recorded(client, admin_key, settings):
    settings(mail_provider="smtp", smtp_url="smtp://127.0.0.1:9", tracking=False)
    nl = factories.newsletter()
    answer = _test(client, admin_key, nl, {"to": ["a@example.test"]})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "provider_unavailable"
    assert db.query("SELECT count(*) FROM email_log")[0][0] == 0


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "to"),
        ({"to": []}, "to"),
        ({"to": "a@example.test"}, "to"),
        ({"to": ["not an address"]}, "to"),
        ({"to": [f"a{i}@example.test" for i in range(11)]}, "to"),
        ({"to": ["a@example.test"], "x": 1}, "x"),
    ],
)
def test_validation_names_the_field(client, admin_key, sink, body, field):
    nl = factories.newsletter()
    answer = _test(client, admin_key, nl, body)
    assert answer.status_code == 422, answer.text
    assert field in [e["field"] for e in answer.json()["errors"]], answer.json()
    assert sink.messages() == []


def test_unknown_newsletter_and_keys(client, admin_key, events_key, sink):
    assert _test(client, admin_key, 999999, {"to": ["a@example.test"]}).status_code == 404
    assert _test(client, events_key, factories.newsletter(), {"to": ["a@example.test"]}).status_code == 403
    assert client.post("/v1/newsletters/1/test", json={"to": ["a@example.test"]}).status_code == 401
    assert sink.messages() == []
