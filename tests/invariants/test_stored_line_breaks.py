"""Rows written before the API refused Unicode line breaks (a subscriber's name, a newsletter's
`from`) still go out: the separators become spaces when the mail is built, over SMTP (a real local
sink) and SendGrid (a real local fake). The rows are inserted directly, as an older version or an
operator in psql left them."""

from __future__ import annotations

import pytest

from digest import send as digest_send
from tests import factories
from tests.digest_support import sink_as_provider
from tests.newsletter_support import counts, drain, start

NAME = "Ana\u2028Lima\u2029Jr\x85"  # U+2028, U+2029, U+0085 (NEL)
SENDER = "News\u2028Desk\u2029Team <news@example.com>"


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


@pytest.fixture
def old_rows():
    """A subscriber and a draft newsletter holding the separators, written straight to the tables."""
    sid = factories.insert("subscribers", user_id="old", email="old@example.test", name=NAME)
    nid = factories.newsletter_row(subject="Hi {{name}}", html="<p>Hello {{name}}</p>", from_addr=SENDER)
    return sid, nid


def test_a_digest_to_a_stored_name_with_line_separators_is_sent_with_spaces(sink, old_rows):
    sid, _ = old_rows
    factories.events("old", 1)
    run = factories.digest_run(sid)
    assert digest_send.process([run])["sent"] == 1
    (msg,) = sink.messages()
    assert msg["To"] == "Ana Lima Jr <old@example.test>"
    assert "Hi Ana, here is your daily digest" in msg.get_body(("plain",)).get_content()  # the first name


def test_a_newsletter_with_a_stored_sender_and_name_with_line_separators_is_sent_over_smtp(sink, old_rows):
    from app.platform import providers

    _, nid = old_rows
    start(nid)
    drain(nid, providers.get_provider())
    assert counts(nid) == {"sent": 1}
    (msg,) = sink.messages()
    assert msg["From"] == "News Desk Team <news@example.com>"
    assert msg["To"] == "Ana Lima Jr <old@example.test>"
    assert msg["Subject"] == "Hi Ana Lima Jr"


def test_a_newsletter_with_a_stored_sender_and_name_with_line_separators_is_sent_over_sendgrid(
    fake, provider, old_rows
):
    _, nid = old_rows
    start(nid)
    drain(nid, provider)
    assert counts(nid) == {"sent": 1}
    (request,) = fake.requests
    assert request["from"] == {"email": "news@example.com", "name": "News Desk Team"}
    (personalization,) = request["personalizations"]
    assert personalization["to"] == [{"email": "old@example.test", "name": "Ana Lima Jr"}]
    assert personalization.get("subject", request["subject"]) == "Hi Ana Lima Jr"
