"""The SES, Postmark and Mailgun providers against real local fakes of their APIs
(tests/fake_providers.py): what each sends, how each answer maps to the three errors, which
failures are ambiguous, and stopping between two mails."""

from __future__ import annotations

import socket

import pytest
from botocore.credentials import Credentials

from app.platform import mail, metrics
from app.platform.providers.base import OutgoingMail, PermanentError, Progress, ThrottledError, TransientError
from app.platform.providers.mailgun import MailgunProvider
from app.platform.providers.postmark import PostmarkProvider
from app.platform.providers.ses import SESProvider
from tests.fake_providers import FakeMailgun, FakePostmark, FakeSES

pytestmark = pytest.mark.pure  # no database: the fakes are the only servers

TIMEOUT = 1.0


def make(kind: str, url: str, *, bad_credentials: bool = False, timeout: float = TIMEOUT, lanes: int = 4):
    """A provider of `kind` pointed at `url` (the fake's, or one where nothing listens)."""
    if kind == "ses":
        secret = "wrong" if bad_credentials else FakeSES.SECRET
        return SESProvider(FakeSES.REGION, url, Credentials(FakeSES.KEY, secret, "session-token"), timeout, lanes)
    if kind == "postmark":
        return PostmarkProvider("wrong" if bad_credentials else FakePostmark.TOKEN, url, timeout)
    key = "wrong" if bad_credentials else FakeMailgun.KEY
    return MailgunProvider(key, FakeMailgun.DOMAIN, url, timeout, lanes)


FAKES = {"ses": FakeSES, "postmark": FakePostmark, "mailgun": FakeMailgun}


@pytest.fixture(params=sorted(FAKES))
def api(request):
    """(kind, fake server, provider) for each of the three."""
    with FAKES[request.param]() as fake:
        provider = make(request.param, fake.url)
        yield request.param, fake, provider
        provider.close()


def mails(n: int, kind: str = "newsletter") -> list[OutgoingMail]:
    return [
        OutgoingMail(
            to=f"r{i}@example.com",
            to_name="Çelik Ö" if i == 0 else f"Reader {i}",
            subject=f"Hello {i}",
            html=f"<p>Hello {i}</p>",
            text=f"Hello {i}",
            idempotency_key=f"{kind}-7-row-{i}" if kind == "newsletter" else f"digest-run-{i}",
            headers=mail.unsubscribe_headers(f"https://n.example/u/tok{i}"),
            custom_args={"mail_kind": kind, "mail_id": "7", "row_id": str(i), "subscriber_id": str(i)},
        )
        for i in range(n)
    ]


def test_each_mail_goes_out_once_with_our_headers_and_the_apis_id(api):
    kind, fake, provider = api
    batch = mails(6)
    results = provider.send_batch(batch)
    assert all(r.ok for r in results) and {r.provider for r in results} == {kind}
    assert fake.unauthorized == 0  # SES: the SigV4 signature recomputed by the fake matched
    for m, r in zip(batch, results):
        ours = mail.message_id_of(m)
        got = fake.delivered[ours]
        assert fake.accepted[ours] == 1
        assert (got["subject"], got["html"], got["text"].strip()) == (m.subject, m.html, m.text)
        assert got["headers"]["List-Unsubscribe"] == m.headers["List-Unsubscribe"]
        assert got["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert got["headers"]["Message-ID"] == f"<{ours}>"
        assert m.to in got["to"]
        # the id the API's webhooks will report
        assert r.message_id == {"ses": f"ses-{ours}", "postmark": f"pm-{ours}", "mailgun": ours}[kind]
    first = fake.delivered[mail.message_id_of(batch[0])]
    assert "Çelik Ö" in first["to"]
    if kind == "ses":
        assert (
            first["tags"]["idempotency_key"] == batch[0].idempotency_key and first["tags"]["mail_kind"] == "newsletter"
        )
        assert first["envelope_to"] == ["r0@example.com"]
    elif kind == "postmark":
        assert fake.batches == [6]  # one call for the batch
        assert first["metadata"] == {**batch[0].custom_args, "idempotency_key": batch[0].idempotency_key}
        assert first["stream"] == "broadcast" and first["tracking"] == (False, "None")
    else:
        assert first["variables"] == {**batch[0].custom_args, "idempotency_key": batch[0].idempotency_key}
        assert first["options"]["o:tracking"] == "no"


def test_postmark_sends_digests_on_the_digest_stream(settings):
    settings(postmark_digest_stream="digests", postmark_newsletter_stream="news")
    with FakePostmark() as fake:
        provider = make("postmark", fake.url)
        provider.send_batch(mails(1, "digest") + mails(1))
        provider.close()
    assert sorted(m["stream"] for m in fake.delivered.values()) == ["digests", "news"]


def test_ses_signs_a_configuration_set_and_leaves_date_and_message_id_out_of_dkim(settings, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    settings(
        ses_configuration_set="notify-events",
        dkim_domain="example.com",
        dkim_selector="s1",
        dkim_private_key=pem.decode(),
    )
    with FakeSES() as fake:
        provider = make("ses", fake.url)
        assert provider.send_batch(mails(1))[0].ok
        provider.close()
    (got,) = fake.delivered.values()
    assert got["configuration_set"] == "notify-events"
    signed = got["headers"]["DKIM-Signature"].replace("\r\n", "").replace(" ", "")
    names = signed.split("h=")[1].split(";")[0].lower().split(":")
    assert "list-unsubscribe" in names and "from" in names
    assert "date" not in names and "message-id" not in names  # SES replaces both


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_wrong_credentials_fail_the_call_permanently(kind):
    with FAKES[kind]() as fake:
        provider = make(kind, fake.url, bad_credentials=True)
        with pytest.raises(PermanentError) as exc:
            provider.send_batch(mails(3))
        provider.close()
    assert "401" in str(exc.value) and fake.unauthorized >= 1 and not fake.accepted


def test_status_mapping(api):
    kind, fake, provider = api
    one = mails(1)
    fake.fail_next(1, 429)
    with pytest.raises(ThrottledError):
        provider.send_batch(one)
    for status, error in [(500, TransientError), (503, TransientError), (403, PermanentError), (404, PermanentError)]:
        fake.fail_next(1, status)
        with pytest.raises(error) as exc:
            provider.send_batch(one)
        assert not isinstance(exc.value, ThrottledError) and str(status) in str(exc.value)
    # A gateway's 504: the provider behind it may have taken the mail.
    fake.fail_next(1, 504)
    (result,) = provider.send_batch(one)
    assert not result.ok and result.ambiguous and result.provider == kind and not result.permanent
    assert provider.send_batch(one)[0].ok
    assert list(fake.accepted.values()) == [1]


def test_a_refused_recipient_fails_alone(api):
    kind, fake, provider = api
    fake.refuse("r1@example.com")
    results = provider.send_batch(mails(3))
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].permanent and not results[1].ambiguous
    assert {"ses": "MessageRejected", "postmark": "406", "mailgun": "400"}[kind] in results[1].error
    assert len(fake.accepted) == 2


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_connection_refused_is_a_definite_transient_error(kind):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    provider = make(kind, f"http://127.0.0.1:{port}")
    with pytest.raises(TransientError) as exc:
        provider.send_batch(mails(3))
    provider.close()
    assert type(exc.value) is TransientError  # never AmbiguousError: nothing was sent


def _ambiguous_count(kind: str) -> float:
    return metrics.PROVIDER_AMBIGUOUS.labels(kind)._value.get()


@pytest.mark.parametrize("knob", ["hang", "drop"])
def test_no_answer_after_sending_is_ambiguous_and_counted(api, knob):
    """The fake accepted the mail and the answer never came (a timeout, a dropped connection): the
    mail is reported ambiguous — it must be retried on this provider only — and counted."""
    kind, fake, provider = api
    before = _ambiguous_count(kind)
    if knob == "hang":
        fake.hang_next(1, TIMEOUT + 1.0)
    else:
        fake.drop_next(1)
    batch = mails(1)
    (result,) = provider.send_batch(batch)
    assert not result.ok and result.ambiguous and result.provider == kind
    assert fake.accepted[mail.message_id_of(batch[0])] == 1  # it WAS accepted: hence "ambiguous"
    assert _ambiguous_count(kind) == before + 1
    # Retried on the same provider: same Message-ID, so the two acceptances are one mail to it.
    assert provider.send_batch(batch)[0].ok
    assert list(fake.accepted) == [mail.message_id_of(batch[0])]


@pytest.mark.parametrize("kind", ["ses", "mailgun"])
def test_one_request_per_mail_apis_stop_between_two_mails(kind):
    with FAKES[kind]() as fake:
        provider = make(kind, fake.url, lanes=1)
        progress = Progress(lambda new: True, every=1)  # the first result asks to stop
        results = provider.send_batch(mails(5), progress)
        provider.close()
    assert results[0].ok and all(r.stopped for r in results[1:])
    assert len(fake.accepted) == 1


def test_postmark_starts_no_call_once_stopped():
    with FakePostmark() as fake:
        provider = make("postmark", fake.url)
        progress = Progress(lambda new: True, every=1, interval=0)
        progress.poll(final=True)  # a stop requested before the batch
        results = provider.send_batch(mails(3), progress)
        provider.close()
    assert all(r.stopped for r in results) and fake.calls == 0


def test_a_throttle_before_anything_was_accepted_is_the_calls_error():
    with FakeSES() as fake:
        provider = make("ses", fake.url, lanes=1)
        fake.fail_next(1, 429)
        with pytest.raises(ThrottledError):
            provider.send_batch(mails(4))
        provider.close()
    assert fake.calls == 1 and not fake.accepted  # no mail started after the throttle


def test_a_throttle_after_some_were_accepted_fails_only_the_rest():
    with FakeMailgun() as fake:
        provider = make("mailgun", fake.url, lanes=1)
        fake._plan.extend([("ok", 0), ("status", 429)])
        results = provider.send_batch(mails(4))
        provider.close()
    assert results[0].ok
    assert all(not r.ok and not r.permanent and "429" in r.error for r in results[1:])
    assert fake.calls == 2  # no mail started after the throttle
