"""A newsletter and a digest go out through each HTTP provider (SES, Postmark, Mailgun), chosen by
MAIL_PROVIDER through the registry, against real local fakes of their APIs and the real Postgres:
each recipient gets one mail, and each row records the id the provider's webhooks will report and
the provider that accepted it."""

from __future__ import annotations

import collections

import pytest

from app.platform import db, providers
from digest import send as digest_send
from tests import factories
from tests.digest_support import run_row
from tests.fake_providers import FakeMailgun, FakePostmark, FakeSES
from tests.newsletter_support import counts, drain, newsletter_status, start

FAKES = {"ses": FakeSES, "postmark": FakePostmark, "mailgun": FakeMailgun}


def configure(settings, kind: str, fake) -> None:
    """MAIL_PROVIDER=kind and its settings, pointed at the fake."""
    common = {"mail_provider": kind, "tracking": False, "provider_timeout_seconds": 1.0}
    if kind == "ses":
        settings(
            **common,
            ses_region=FakeSES.REGION,
            ses_endpoint_url=fake.url,
            aws_access_key_id=FakeSES.KEY,
            aws_secret_access_key=FakeSES.SECRET,
        )
    elif kind == "postmark":
        settings(**common, postmark_server_token=FakePostmark.TOKEN, postmark_api_url=fake.url)
    else:
        settings(**common, mailgun_api_key=FakeMailgun.KEY, mailgun_domain=FakeMailgun.DOMAIN, mailgun_api_url=fake.url)


@pytest.fixture(params=sorted(FAKES))
def api(request, settings, redis_client):
    """(kind, fake) with MAIL_PROVIDER set to it; the newsletter rate limit lives in the test's Redis db."""
    with FAKES[request.param]() as fake:
        configure(settings, request.param, fake)
        yield request.param, fake
        providers.close_all()


def expected_id(kind: str, ours: str) -> str:
    """The fakes answer as the real APIs do: SES and Postmark with ids of their own, Mailgun with ours."""
    return {"ses": f"ses-{ours}", "postmark": f"pm-{ours}", "mailgun": ours}[kind]


def test_a_newsletter_goes_out_once_per_recipient_with_ids_recorded(api):
    kind, fake = api
    factories.seed_subscribers(30)
    nl = factories.newsletter()
    start(nl)
    drain(nl, None)  # None: the registry's provider, MAIL_PROVIDER
    assert counts(nl) == {"sent": 30} and newsletter_status(nl) == "done"
    assert fake.recipients() == collections.Counter({f"user{i}@example.com": 1 for i in range(1, 31)})
    assert fake.unauthorized == 0
    rows = db.query(
        "SELECT e.id, e.provider, e.provider_message_id, s.email FROM email_log e "
        "JOIN subscribers s ON s.id = e.subscriber_id WHERE e.newsletter_id = %s",
        (nl,),
    )
    by_to = {m["to"].rpartition("<")[2].strip(">"): mid for mid, m in fake.delivered.items()}
    for _, provider, message_id, address in rows:
        assert provider == kind
        assert message_id == expected_id(kind, by_to[address])
    mail = next(m for m in fake.delivered.values() if "user7@example.com" in m["to"])
    assert mail["subject"] == "Hi User 7" and "User 7" in mail["html"]
    assert mail["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_a_digest_goes_out_once_with_its_id_recorded(api):
    kind, fake = api
    sid = factories.subscriber("u1", name="Ana Lima")
    factories.events("u1", 3, entity_id="p1")
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    ((ours, mail),) = fake.delivered.items()
    assert ours.startswith(f"digest-run-{rid}.") and "u1@example.test" in mail["to"]
    row = run_row(rid)
    assert row["status"] == "sent" and row["provider_message_id"] == expected_id(kind, ours)
    assert db.query("SELECT provider FROM digest_runs WHERE id = %s", (rid,))[0][0] == kind
    if kind == "postmark":
        assert mail["stream"] == "outbound"  # POSTMARK_DIGEST_STREAM
    assert digest_send.process([rid])["sent"] == 0 and sum(fake.accepted.values()) == 1


def test_a_refused_recipient_fails_its_row_alone(api):
    kind, fake = api
    factories.seed_subscribers(5)
    fake.refuse("user3@example.com")
    nl = factories.newsletter()
    start(nl)
    drain(nl, None)
    assert counts(nl) == {"sent": 4, "failed": 1}
    (error,) = db.query("SELECT error FROM email_log WHERE status = 'failed'")[0]
    assert {"ses": "MessageRejected", "postmark": "406", "mailgun": "400"}[kind] in error


def test_an_ambiguous_timeout_is_retried_on_the_same_provider_and_recorded(api, settings):
    """The fake took the mail and its answer never came: the row goes back to pending naming the
    provider (the one it may be at), and its retry is accepted there — same Message-ID."""
    kind, fake = api
    settings(send_batch_size=1)
    factories.seed_subscribers(1)
    fake.hang_next(1, 2.0)
    nl = factories.newsletter()
    start(nl)
    drain(nl, None, max_rounds=1)
    ((status, provider, error),) = db.query("SELECT status, provider, error FROM email_log")
    assert status == "pending" and provider == kind and "may have accepted" in error
    db.query("UPDATE email_log SET next_attempt_at = NULL")  # skip the backoff
    drain(nl, None)
    assert counts(nl) == {"sent": 1}
    ((_, n),) = fake.accepted.items()  # the same mail, twice at the same provider
    assert n == 2
    assert db.query("SELECT provider FROM email_log")[0][0] == kind
