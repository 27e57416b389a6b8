"""app/newsletter/tracked.py: a plan's document is, byte for byte, what tracking/links.py makes of the
rendered one (in the form the send loop mails, Compiled.mail_html) — for the benchmark's
newsletter, for generated templates (links in and out of sections, comments, <script>, values in
attributes, non-ASCII text) and generated recipients — and a template whose links could depend on
the recipient gets no plan."""

from __future__ import annotations

import email
import email.policy
import html as html_lib
import itertools

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from app.newsletter import template, tracked
from app.platform import config, mail
from app.platform.providers.base import OutgoingMail
from scripts.bench import shared
from tracking import links

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)


@pytest.fixture(autouse=True)
def fake_link_rows(monkeypatch):
    """Link ids without a database: one per (mail, url), as email_links gives."""
    ids: dict[tuple[int, str], int] = {}
    counter = itertools.count(1)

    def ensure_links_many(mail_kind, urls_by_mail):
        out: dict[int, dict[str, int]] = {}
        for mail_id, urls in urls_by_mail.items():
            for url in urls:
                key = (int(mail_id), url)
                if key not in ids:
                    ids[key] = next(counter)
                out.setdefault(int(mail_id), {})[url] = ids[key]
        return out

    monkeypatch.setattr(links, "ensure_links_many", ensure_links_many)


def _context(name: str, sub: int) -> dict:
    base = config.get().base_url
    return {
        "name": name,
        "email": f"user{sub}@example.com",
        "user_id": f"u{sub}",
        "unsubscribe_url": f"{base}/u/TOKEN{sub}",
        "preferences_url": f"{base}/preferences/TOKEN{sub}",
        "locale": None,
    }


def _both(compiled: template.Compiled, context: dict, sub: int) -> tuple[str, str | None]:
    """(tracking/links.py's document, the plan's or None when there is none or it does not apply)."""
    rewriter = links.LinkRewriter("newsletter", 7)
    expected = rewriter.rewrite(compiled.render(dict(context), compiled.mail_html).html, sub)
    plan = tracked.plan(compiled.html_tokens, links.LinkRewriter("newsletter", 7), compiled.html_ascii)
    if plan is None:
        return expected, None
    full = compiled.full_context(dict(context))
    if not plan.applies(full, rewriter):
        return expected, None
    values = tracked.Tracker(rewriter, "newsletter", 7).values(plan, sub)
    return expected, compiled.render(full, plan.template, values).html


@pytest.mark.parametrize("name", ["Ana", "", "Zoë <b>&amp;</b> \"q\" 'x'", "名前", "a\x85b"])
def test_the_benchmark_newsletter_is_planned_and_the_same(name):
    compiled = template.Compiled("Weekly letter for {{name}}", shared.HTML, shared.TEXT)
    plan = tracked.plan(compiled.html_tokens, links.LinkRewriter("newsletter", 7), compiled.html_ascii)
    assert plan is not None and len(plan.urls) == 3
    expected, got = _both(compiled, _context(name, 42), 42)
    assert got == expected


@pytest.mark.parametrize(
    "html",
    [
        '<p>{{{name}}}</p><a href="https://x.test/a">a</a>',  # a raw value could bring a link
        '<a {{name}} href="https://x.test/a">a</a>',  # a value inside a tag, not quoted
        "<a href='{{name}}'>a</a>",  # single quotes: a value may hold one
        '<!-- {{name}} --><a href="https://x.test/a">a</a>',  # a value in a comment
        '<a href="https://x.test/{{user_id}}">a</a>',  # part of a URL is the recipient's
        '{{#name}}<script>{{/name}}<a href="https://x.test/a">a</a></script>',  # hidden or not by a section
        "<body>{{#name}}</body>{{/name}}</body>",  # the pixel's place by a section
        '{{#name}}<img src="https://x.test/i.png">{{/name}}<p>x</p>',  # the pixel's form by a section
        "<p>a < {{name}} b</p>",  # a stray "<"
    ],
)
def test_templates_whose_links_may_depend_on_the_recipient_get_no_plan(html):
    compiled = template.Compiled("s", html, "t", postal_address="")
    assert tracked.plan(compiled.html_tokens, links.LinkRewriter("newsletter", 7), compiled.html_ascii) is None


def test_a_trackable_url_as_a_recipients_href_value_is_rewritten_as_rendered():
    compiled = template.Compiled("s", '<p><a href="{{user_id}}">me</a> <a href="https://x.test/a">a</a></p>', "t")
    context = {**_context("Ana", 3), "user_id": "https://tracked.example/me"}
    expected, got = _both(compiled, context, 3)
    assert got is None and "tracked.example" not in expected  # rewritten: the recipient's link is tracked
    context["user_id"] = "u3"
    expected, got = _both(compiled, context, 3)
    assert got == expected


_PIECES = [
    '<a href="https://x.test/a">A</a>',
    '<a class="c" href="https://x.test/b?x=1&amp;y=2">B</a>',
    '<a href="https://x.test/ü">Ü</a>',
    '<area href="https://x.test/c">',
    '<a href="mailto:a@x.test">m</a>',
    '<a href="{{unsubscribe_url}}">u</a>',
    '<a href="{{preferences_url}}" title="{{name}}">p</a>',
    '<a href="{{user_id}}">me</a>',
    "<p>Hello {{name}}, {{greeting}}</p>",
    "<p>é · {{email}}</p>",
    '<!-- <a href="https://x.test/hidden">h</a> -->',
    "<script>var a = 1; // {{name}}\n</script>",
    '<img src="https://x.test/i.png" alt="{{name}}">',
    '{{#name}}<p>for {{name}} <a href="https://x.test/n">n</a></p>{{/name}}',
    '{{^name}}<p>no name <a href="https://x.test/a">again</a></p>{{/name}}',
    "{{! a comment }}",
    "<body>",
    "</body>",
    "\n",
]


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12),
    name=st.text(max_size=12),
    email=st.text(max_size=12),
    sub=st.integers(min_value=1, max_value=10**9),
    user_id=st.one_of(
        st.sampled_from(["u1", "https://x.test/me", " HTTP://X.test/é ", "javascript:x", "http://localhost:8000/u/T"]),
        st.text(max_size=12),
    ),
)
def test_a_plan_writes_what_link_rewriting_writes(pieces, name, email, sub, user_id):
    html = "".join(pieces)
    compiled = template.Compiled("s", html, "t")
    context = {**_context(name, sub), "email": email, "user_id": user_id}
    expected, got = _both(compiled, context, sub)
    if got is not None:
        assert got == expected


_NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)


@hypothesis_settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAMES, subject=_NAMES, body=_NAMES)
def test_the_mailed_html_is_the_rendered_document_in_ascii_and_parses_back_the_same(name, subject, body):
    """Compiled.mail_html (what the send loop mails): the rendered document with other characters
    as numeric references (mail.ascii_html of it), sent 7bit; the email package reads back a part
    that a browser reads as the quoted-printable one of the document as written."""
    html = f"<p>{{{{name}}}} · {body.replace('{', '(')}</p><p>é</p>"
    compiled = template.Compiled(f"{subject.replace('{', '(')} {{{{name}}}}", html, "t")
    assert compiled.html_ascii
    context = {**_context(name, 5), "email": "ana@example.test"}
    as_written = compiled.render(dict(context)).html
    mailed = compiled.render(dict(context), compiled.mail_html).html
    assert mailed.isascii() and mailed == mail.ascii_html(as_written)
    built = [
        email.message_from_bytes(
            mail.build(OutgoingMail(to="ana@example.test", subject="s", html=doc, text="t", idempotency_key="k")),
            policy=email.policy.default,
        )
        for doc in (as_written, mailed)
    ]
    old, new = (m.get_body(("html",)) for m in built)
    assert new["Content-Transfer-Encoding"] == "7bit"
    assert html_lib.unescape(new.get_content()) == html_lib.unescape(old.get_content())
