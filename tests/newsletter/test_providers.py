"""SendGridProvider against the local fake server, and newsletter template compilation."""

from __future__ import annotations

import gc
import socket

import httpx
import pytest

from app.newsletter import template
from app.platform.providers.base import OutgoingMail, PermanentError, ThrottledError, TransientError
from app.platform.providers.sendgrid import MAX_SUBSTITUTION_BYTES, SendGridProvider, build_requests

HTML = (
    '<html><body><p class="x">Hi {{name}}</p><a href="{{unsubscribe_url}}">unsubscribe</a>'
    '<p>{{{user_id}}}</p><img src="https://t.example/o/{{user_id}}.gif"></body></html>'
)


def mails_from_template(names, source=HTML, from_addr=None):
    compiled = template.Compiled("Hello {{name}}", source, None)
    out = []
    for i, name in enumerate(names):
        r = compiled.render(
            {
                "name": name,
                "email": f"r{i}@example.com",
                "user_id": f"id{i}",
                "unsubscribe_url": f"https://x.example/u/tok{i}?a=1&b=2",
                "preferences_url": "p",
            }
        )
        out.append(
            OutgoingMail(
                to=f"r{i}@example.com",
                subject=r.subject,
                html=r.html,
                text=r.text,
                idempotency_key=f"newsletter-1-row-{i}",
                from_addr=from_addr,
                to_name=name,
                headers={"List-Unsubscribe": f"<https://x.example/u/tok{i}>"},
                custom_args={"mail_kind": "newsletter", "mail_id": "1", "row_id": str(i), "subscriber_id": str(i)},
            )
        )
    return out


def test_one_request_per_batch_and_each_recipient_gets_exactly_their_mail(fake, provider):
    names = ["Ana", 'Bo "Bob" <b>', "Çelik & Söhne", "", "O'Neil", "x" * 300, "Line\nBreak"]
    mails = mails_from_template(names)
    results = provider.send_batch(mails)
    assert all(r.ok for r in results) and results[0].message_id == "fake-1"
    # A value with a line break changes the text part's line structure: that one mail goes in a
    # second request with its own content; the other six share one body.
    assert fake.calls == 2 and [len(r["personalizations"]) for r in fake.requests] == [6, 1]
    for m in mails:
        got = fake.delivered[m.idempotency_key]
        assert (got["to"], got["subject"], got["html"], got["text"]) == (m.to, m.subject, m.html, m.text)
        assert got["headers"] == m.headers
        assert got["custom_args"] == {**m.custom_args, "idempotency_key": m.idempotency_key}
    assert fake.idempotency_headers[0]


def test_identical_content_shares_the_body_without_substitutions():
    mails = [
        OutgoingMail(to=f"r{i}@example.com", subject="Same", html="<p>same</p>", text="same", idempotency_key=f"k{i}")
        for i in range(3)
    ]
    [(payload, indexes)] = build_requests(mails, "Notify <n@example.com>")
    assert indexes == [0, 1, 2]
    assert all("substitutions" not in p for p in payload["personalizations"])
    assert payload["from"] == {"email": "n@example.com", "name": "Notify"}


def test_mails_that_cannot_share_a_body_get_their_own_request(fake, provider):
    mails = mails_from_template(["Ana", "Bea"])
    # An unescaped variable carrying markup changes the structure: that mail is sent on its own.
    odd = mails_from_template(["Cy"])[0]
    odd.html = odd.html.replace("<p>id0</p>", "<p><b>markup</b></p>")
    odd.idempotency_key = "newsletter-1-row-odd"
    big = mails_from_template(["D" * (MAX_SUBSTITUTION_BYTES + 10)])[0]
    big.idempotency_key = "newsletter-1-row-big"
    other_sender = mails_from_template(["Eve"], from_addr="Other <o@example.com>")[0]
    other_sender.idempotency_key = "newsletter-1-row-other"
    batch = [*mails, odd, big, other_sender]
    assert all(r.ok for r in provider.send_batch(batch))
    assert fake.calls == 4
    for m in batch:
        got = fake.delivered[m.idempotency_key]
        assert (got["html"], got["text"], got["subject"]) == (m.html, m.text, m.subject)


def test_status_mapping(fake, provider):
    mails = mails_from_template(["Ana"])
    fake.throttle_for(2)
    with pytest.raises(ThrottledError) as throttled:
        provider.send_batch(mails)
    assert 0 < throttled.value.retry_after <= 4
    fake.throttle_for(0)
    for status, error in [
        (500, TransientError),
        (503, TransientError),
        (400, PermanentError),
        (401, PermanentError),
        (403, PermanentError),
        (413, PermanentError),
    ]:
        fake.fail_next(1, status=status)
        with pytest.raises(error) as exc:
            provider.send_batch(mails)
        assert not isinstance(exc.value, ThrottledError)
        assert str(status) in str(exc.value)
    assert provider.send_batch(mails)[0].ok
    assert fake.delivered_count == 1


def test_unreachable_sendgrid_is_transient():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    p = SendGridProvider(api_key="k", api_url=f"http://127.0.0.1:{port}/v3/mail/send", timeout=2)
    with pytest.raises(TransientError):
        p.send_batch(mails_from_template(["Ana"]))
    p.close()


def test_later_group_failure_reports_only_unsent_mails(fake, provider):
    first = mails_from_template(["Ana"])[0]
    second = mails_from_template(["Bo"], from_addr="Other <o@example.com>")[0]
    second.idempotency_key = "second"

    calls = {"n": 0}
    original = provider._post

    def flaky(payload, keys):
        calls["n"] += 1
        if calls["n"] == 2:
            raise TransientError("boom")
        return original(payload, keys)

    provider._post = flaky
    results = provider.send_batch([first, second])
    assert results[0].ok and not results[1].ok and not results[1].permanent


def test_batch_over_1000_is_refused(provider):
    with pytest.raises(ValueError):
        provider.send_batch(mails_from_template(["a"]) * 1001)


def test_template_compiles_css_once_and_keeps_mustache_tags():
    compiled = template.Compiled(
        "Hi {{name}}",
        "<html><head><style>a { color: red; }</style></head><body>"
        '<a href="{{unsubscribe_url}}">u</a> <a href="{{preferences_url}}">p</a></body></html>',
        None,
    )
    html_source = "".join(v if k == "literal" else f"{{{{{v}}}}}" for k, v in compiled.html_tokens)
    assert 'href="{{unsubscribe_url}}"' in html_source and 'style="color:red"' in html_source
    r = compiled.render(
        {"name": "A\r\nBcc: x", "unsubscribe_url": "https://u/1?a=1&b=2", "preferences_url": "https://p"}
    )
    assert 'href="https://u/1?a=1&amp;b=2"' in r.html
    assert r.subject == "Hi A Bcc: x"  # no header injection through a name
    assert "u (https://u/1?a=1&b=2)" in r.text  # text derived from the HTML, not HTML-escaped


def test_template_check_reports_problems():
    assert template.check("html", "<p>{{name}} {{#email}}{{email}}{{/email}}</p>") == []
    problems = template.check("html", "{{nope}} {{> partial}}")
    assert [p["message"].split()[0] for p in problems] == ["unknown", "partials"]
    assert "not a valid Mustache" in template.check("html", "{{#name}}")[0]["message"]


def test_a_calls_request_body_is_freed_without_the_cyclic_collector(fake, provider):
    """httpx keeps a response and its stream in a reference cycle that holds the request and its
    body; workers run the cyclic collector rarely, so every call's megabytes stayed until a full
    collection (worker RSS grew in steps). The provider breaks the cycle: nothing of a call is left
    for the collector."""
    provider.send_batch(mails_from_template(["Ana", "Bo"]))  # connections and caches warmed
    gc.collect()
    gc.disable()
    try:
        provider.send_batch(mails_from_template(["Cy", "Di", "Eve"]))
        left = [o for o in gc.get_objects() if isinstance(o, (httpx.Request, httpx.Response))]
        assert left == []
    finally:
        gc.enable()
