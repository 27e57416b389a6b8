"""One bad recipient never stops good ones (issue: failure isolation).

A batch of 100 with one poisoned recipient sends the 99 others in the same call and fails — or
retries with backoff, counted — exactly that one, for digests and newsletters, over SMTP (a real
local aiosmtpd relay without SMTPUTF8) and SendGrid (the local fake speaking v3 mail/send).

Kinds of poison:
  encoding  a non-ASCII local part (jö@…): needs SMTPUTF8, which this relay and SendGrid lack
  header    a name with CR/LF and a Bcc: line: cleaned (it is data), so it is SENT, never injected
  template  rendering that one recipient raises something unexpected (a bug, an odd payload)
  refused   the relay answers 550 at RCPT / SendGrid answers 400 naming that personalization
  5xx       the relay answers 554 to that message's DATA (SMTP only: SendGrid answers per request,
            so its 5xx is a batch-level error, retried with backoff — tests/newsletter/test_send.py)
"""

from __future__ import annotations

import pytest

from app.newsletter import sender as newsletter_sender
from app.platform import db
from app.platform.providers.sendgrid import SendGridProvider
from app.platform.providers.smtp import SMTPProvider
from digest import build as digest_build
from digest import send as digest_send
from tests import factories
from tests import newsletter_support as nl
from tests.digest_support import SmtpSink, run_row

N = 100
POISON = 42
KINDS = ["encoding", "header", "template", "refused", "5xx"]
CASES = [
    (channel, kind)
    for channel in ("smtp", "sendgrid")
    for kind in KINDS
    if not (channel == "sendgrid" and kind == "5xx")
]


def poisoned_address(kind: str) -> str:
    return "jö@example.com" if kind == "encoding" else f"user{POISON}@example.com"


@pytest.fixture
def channel(request, redis_client):
    """(provider, poison(kind, address)) for a real local SMTP relay or the fake SendGrid."""
    if request.param == "smtp":
        sink = SmtpSink(enable_SMTPUTF8=False).start()
        provider = SMTPProvider(sink.url, pool_size=4)

        def poison(kind, address):
            if kind == "refused":
                sink.reject_rcpt.add(address)
            elif kind == "5xx":
                sink.reject_data[address] = "554 5.7.1 message refused for this recipient"

        yield provider, poison, lambda: len(sink.raw)
        provider.close()
        sink.stop()
    else:
        from tests.fake_sendgrid import FakeSendGrid

        with FakeSendGrid() as fake:
            provider = SendGridProvider(api_key="k", api_url=fake.url)

            def poison(kind, address):
                if kind == "refused":
                    fake.refuse(address)

            yield provider, poison, lambda: fake.delivered_count
            provider.close()


def _subscribers(kind: str) -> list[int]:
    ids = []
    for i in range(N):
        email = poisoned_address(kind) if i == POISON else f"user{i}@example.com"
        name = "Eve\r\nBcc: victim@example.com" if (i == POISON and kind == "header") else f"User {i}"
        ids.append(factories.subscriber(f"u{i}", email=email, name=name))
    return ids


@pytest.mark.parametrize("channel,kind", CASES, indirect=["channel"])
def test_digest_batch_sends_99_and_isolates_the_poisoned_one(kind, channel, monkeypatch, settings):
    provider, poison, delivered = channel
    settings(digest_claim_batch=N)
    subs = _subscribers(kind)
    for i in range(N):
        factories.events(f"u{i}", 2, payload={"title": f"Post {i}", "url": f"https://example.com/p/{i}"})
    runs = [factories.digest_run(sid) for sid in subs]
    poison(kind, poisoned_address(kind))
    if kind == "template":
        real = digest_build.render_mail

        def render(run, *args):
            if run.user_id == f"u{POISON}":
                raise KeyError("a payload shape nobody expected")
            return real(run, *args)

        monkeypatch.setattr(digest_build, "render_mail", render)

    counts = digest_send.process(runs, provider=provider)

    bad = run_row(runs[POISON])
    others = [run_row(r) for i, r in enumerate(runs) if i != POISON]
    assert all(r["status"] == "sent" for r in others)
    if kind == "header":  # cleaned, not failed: everyone got their digest
        assert counts["sent"] == N and bad["status"] == "sent" and delivered() == N
        return
    assert counts["sent"] == N - 1 and delivered() == N - 1
    assert bad["last_error"] and bad["attempts"] == 1
    if kind == "template":  # unexpected: retried later with backoff, counted
        assert counts["retry"] == 1 and bad["status"] == "pending" and bad["next_attempt_at"] is not None
    else:  # the recipient is refused: no retry can help
        assert counts["failed"] == 1 and bad["status"] == "failed"


@pytest.mark.parametrize("channel,kind", CASES, indirect=["channel"])
def test_newsletter_batch_sends_99_and_isolates_the_poisoned_one(kind, channel, monkeypatch, settings):
    provider, poison, delivered = channel
    settings(send_batch_size=N)
    _subscribers(kind)
    newsletter_id = factories.newsletter()
    nl.start(newsletter_id)
    poison(kind, poisoned_address(kind))
    if kind == "template":
        real = newsletter_sender.Renderer.render

        def render(renderer, row):
            if row.user_id == f"u{POISON}":
                raise KeyError("a value nobody expected")
            return real(renderer, row)

        monkeypatch.setattr(newsletter_sender.Renderer, "render", render)

    stats = newsletter_sender.send_batch(newsletter_id, provider=provider, reenqueue=False, budget_seconds=60)

    rows = dict(
        db.query(
            "SELECT s.user_id, e.status FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id "
            "WHERE e.newsletter_id = %s",
            (newsletter_id,),
        )
    )
    bad = rows.pop(f"u{POISON}")
    assert set(rows.values()) == {"sent"} and len(rows) == N - 1
    if kind == "header":
        assert stats.sent == N and bad == "sent" and delivered() == N
        return
    assert stats.sent == N - 1 and stats.failed == 1 and bad == "failed" and delivered() == N - 1
    (error,) = db.query(
        "SELECT error FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id WHERE s.user_id = %s",
        (f"u{POISON}",),
    )[0]
    assert error


def test_a_cleaned_name_never_injects_a_header():
    sink = SmtpSink().start()
    try:
        sid = factories.subscriber("eve", email="eve@example.com", name="Eve\r\nBcc: victim@example.com")
        factories.events("eve", 1)
        provider = SMTPProvider(sink.url, pool_size=1)
        assert digest_send.process([factories.digest_run(sid)], provider=provider)["sent"] == 1
        provider.close()
        (msg,) = sink.messages()
        assert msg["Bcc"] is None and msg["To"].addresses[0].addr_spec == "eve@example.com"
        assert sink.envelopes[0][1] == ["eve@example.com"]
    finally:
        sink.stop()


def test_an_unexpected_provider_error_retries_the_batch_counted_never_forever(settings):
    """A bug inside a provider is a batch-level failure: every run retries with backoff and the
    attempt counts, so it ends `failed` instead of looping on every tick."""
    from app.platform.providers.base import Provider

    class Broken(Provider):
        name, max_batch = "broken", 100

        def deliver(self, prepared, progress):
            raise RuntimeError("library surprise")

    settings(digest_max_attempts=2)
    sid = factories.subscriber("u1")
    factories.events("u1", 1)
    rid = factories.digest_run(sid)
    assert digest_send.process([rid], provider=Broken())["retry"] == 1
    row = run_row(rid)
    assert row["status"] == "pending" and row["attempts"] == 1 and "library surprise" in row["last_error"]
    db.query("UPDATE digest_runs SET next_attempt_at = now() - interval '1 second'")
    digest_send.process([rid], provider=Broken())
    row = run_row(rid)
    assert row["status"] == "failed" and row["attempts"] == 2
