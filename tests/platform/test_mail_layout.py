"""The mail layout (brand header, card, colours) around digests and newsletter fragments; brand
settings that cannot inject markup or CSS; the {{name}} fallback."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.newsletter import template
from app.platform import config, mail_layout
from digest import context, group, render
from tests import factories
from tests.newsletter_support import drain, start

CONTEXT = {
    "name": "",
    "email": "a@example.com",
    "user_id": "u1",
    "unsubscribe_url": "https://x.example/u/TOKEN",
    "preferences_url": "https://x.example/preferences/P",
}
BRAND = mail_layout.Brand("Acme <News>", "https://cdn.example.com/logo.png?a=1&b=2", "#c0ffee", "#fff")


@pytest.mark.parametrize(
    "name, value",
    [
        ("brand_color", "red"),
        ("brand_color", "#12345"),
        ("brand_color", "#fff;background:url(x)"),
        ("brand_background", "#ffffff}body{x"),
        ("brand_background", ""),
        ("brand_logo_url", "http://cdn.example.com/logo.png"),
        ("brand_logo_url", 'https://x.example/a.png" onerror="x'),
        ("brand_logo_url", "https://x.example/a.png><script>"),
        ("brand_logo_url", "javascript:alert(1)"),
        ("brand_logo_url", "https:///nohost.png"),
        ("brand_logo_url", "https://x.example/a b.png"),
        ("brand_name", ""),
        ("brand_name", "Acme\nInjected: header"),
        ("brand_name", "x" * 101),
        ("name_fallback", "friend\r\nX-Injected: 1"),
        ("name_fallback", "x" * 61),
    ],
)
@pytest.mark.pure
def test_brand_settings_that_could_inject_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(config.env_name(name), value)
    if value == "":  # an empty environment variable means "use the default"; set it in process
        with pytest.raises(config.ConfigError, match=config.env_name(name)):
            config.check_brand(config.Settings(**{name: value}))
        return
    with pytest.raises(config.ConfigError, match=config.env_name(name)):
        config.load()


@pytest.mark.pure
def test_good_brand_settings_load(monkeypatch):
    for name, value in (
        ("BRAND_COLOR", "#0A0"),
        ("BRAND_BACKGROUND", "#fafafa"),
        ("BRAND_NAME", "Acme & Co"),
        ("BRAND_LOGO_URL", "https://cdn.example.com/logo.png?v=2&x=1"),
        ("NAME_FALLBACK", "friend"),
    ):
        monkeypatch.setenv(name, value)
    s = config.load()
    assert (s.brand_color, s.brand_name, s.name_fallback) == ("#0A0", "Acme & Co", "friend")


@pytest.mark.pure
def test_wrap_places_regions_and_escapes_the_brand():
    fragment = (
        "<title>T</title><style>.x { color: red; }</style><!-- layout:before --><p>pre</p>"
        "<!-- layout:card --><p>body</p><!-- layout:after --><p>foot</p>"
    )
    html = mail_layout.wrap(fragment, BRAND)
    assert html.index("<title>T</title>") < html.index(".x { color: red; }") < html.index("</head>")
    assert (
        html.index("<p>pre</p>")
        < html.index('class="layout-header"')
        < html.index("<p>body</p>")
        < html.index('class="layout-after"')
        < html.index("<p>foot</p>")
    )
    assert 'alt="Acme &lt;News&gt;"' in html and "<News>" not in html
    assert 'src="https://cdn.example.com/logo.png?a=1&amp;b=2"' in html
    assert "border-top: 4px solid #c0ffee" in html and "background: #fff;" in html
    # no logo: the name as text; unmarked text is the card
    plain = mail_layout.wrap("<p>only</p>", mail_layout.Brand("Acme", "", "#123", "#fff"))
    assert '<span class="layout-brand">Acme</span>' in plain and "<title>Acme</title>" in plain
    assert (
        plain.index('class="layout-card"') < plain.index("<p>only</p>")
        and "layout-after" not in plain.split("</style>")[1]
    )


@pytest.mark.pure
def test_full_documents_are_not_fragments():
    assert mail_layout.is_fragment("<p>Hi {{name}}</p>")
    for doc in ("<!doctype html><p>x</p>", "<HTML><p>x</p></HTML>", "<body><p>x</p></body>", factories.HTML):
        assert not mail_layout.is_fragment(doc)


@pytest.mark.pure
def test_a_newsletter_fragment_is_wrapped_and_a_full_document_is_not():
    wrapped = template.Compiled(
        "s", '<p>Hi {{name}}</p><p><a href="https://example.com/x">Read</a></p>', None, "", BRAND
    ).render({**CONTEXT, "name": "Bo"})
    assert "Acme &lt;News&gt;" in wrapped.html and "<p" in wrapped.html and "Hi Bo" in wrapped.html
    assert 'class="layout-card"' in wrapped.html and "<style" not in wrapped.html  # inlined once
    assert "color:#c0ffee" in wrapped.html.replace(" ", "")  # links take the accent
    # the compliance footer still lands inside <body>, once
    assert wrapped.html.count("https://x.example/u/TOKEN") == 1
    assert wrapped.html.index("https://x.example/u/TOKEN") < wrapped.html.index("</body>")
    assert "Acme" not in wrapped.text and "Hi Bo" in wrapped.text  # text: no layout
    full = template.Compiled("s", factories.HTML, None, "", BRAND).render(CONTEXT)
    assert "layout-card" not in full.html and "Acme" not in full.html


@pytest.mark.pure
def test_empty_name_renders_the_fallback_but_sections_see_the_real_name(settings):
    settings(name_fallback="there")
    source = "<p>Hi {{name}}, {{{name}}}!</p>{{#name}}<i>known</i>{{/name}}{{^name}}<i>anon</i>{{/name}}"
    compiled = template.Compiled("Hello {{name}}", source, None, "")
    anon = compiled.render(CONTEXT)
    assert anon.subject == "Hello there" and "<p>Hi there, there!</p><i>anon</i>" in anon.html
    assert "Hi there, there!" in anon.text
    known = compiled.render({**CONTEXT, "name": "Ana"})
    assert known.subject == "Hello Ana" and "<p>Hi Ana, Ana!</p><i>known</i>" in known.html
    settings(name_fallback="friend")
    assert template.Compiled("Hello {{name}}", source, None, "").render(CONTEXT).subject == "Hello friend"


def _digest_ctx(name: str) -> dict:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    d = group.build([group.Event(1, "like", "post", "p1", "a1", "Eli", now)], 5)
    return context.build(
        d,
        context.Reader(
            name=name,
            cadence="daily",
            timezone="UTC",
            last_digest_at=None,
            unsubscribe_url="https://x.test/u/T",
            preferences_url="https://x.test/preferences/T",
            view_url="https://x.test/v/V",
        ),
        categories={},
        now=now,
    )


@pytest.mark.pure
def test_digest_greeting_uses_the_fallback(settings):
    assert _digest_ctx("")["heading"] == "Hi, here is your daily digest"
    assert _digest_ctx("Ana Lima")["heading"] == "Hi Ana, here is your daily digest"
    settings(name_fallback="friend")
    assert _digest_ctx("")["heading"] == "Hi friend, here is your daily digest"


@pytest.mark.pure
def test_one_greeting_in_digests_and_newsletters_and_never_for_there():
    """Issue 22.6: "Hi Ana," / "Hi," in both kinds of mail; a nameless reader's {{name}} is empty, and
    a subject written with a section reads naturally either way."""
    compiled = template.Compiled(
        "News{{#name}} for {{name}}{{/name}}", "<p>{{greeting}} here is the news.</p>", None, ""
    )
    anon = compiled.render(CONTEXT)
    assert anon.subject == "News" and "<p>Hi, here is the news.</p>" in anon.html and "Hi, here is" in anon.text
    known = compiled.render({**CONTEXT, "name": "Ana Lima"})
    assert known.subject == "News for Ana Lima" and "<p>Hi Ana, here is the news.</p>" in known.html
    assert "there" not in template.Compiled("News for {{name}}", "<p>x</p>", None, "").render(CONTEXT).subject
    assert _digest_ctx("Ana Lima")["greeting"] == "Hi Ana," and _digest_ctx("  ")["greeting"] == "Hi,"


@pytest.mark.pure
def test_digest_takes_the_brand_and_recompiles_when_it_changes(settings):
    settings(brand_name="Acme", brand_color="#abcdef")
    out = render.render(_digest_ctx("Ana"))
    assert '<span class="layout-brand"' in out.html and ">Acme</span>" in out.html
    assert "#abcdef" in out.html and "<style" not in out.html
    assert 'href="https://x.test/v/V"' in out.html and "View in your browser" in out.html
    assert "View in your browser: https://x.test/v/V" in out.text
    settings(brand_name="Other", brand_color="#123456")
    again = render.render(_digest_ctx("Ana"))
    assert ">Other</span>" in again.html and "#123456" in again.html and "#abcdef" not in again.html
    # no view link (the hosted copy itself): no line
    ctx = {**_digest_ctx("Ana"), "view_url": "", "has_view_url": False}
    assert "View in your browser" not in render.render(ctx).html


def test_a_fragment_newsletter_goes_out_in_the_layout(fake, provider, settings):
    settings(brand_name="Acme Weekly", brand_color="#aa3300")
    factories.subscriber("u1", name="")
    nl = factories.newsletter(
        subject="News for {{name}}", html='<h1>Hello {{name}}</h1><p><a href="https://example.com/a">Read</a></p>'
    )
    start(nl)
    drain(nl, provider)
    (mail,) = fake.delivered.values()
    assert mail["subject"] == "News for"  # NAME_FALLBACK is empty: never "News for there"
    assert "Acme Weekly" in mail["html"] and "<h1>Hello </h1>" in mail["html"] and "layout-card" in mail["html"]
    assert mail["html"].count("/u/") == 1  # the compliance footer, inside the layout's <body>


def test_the_demo_newsletter_goes_out_in_the_layout(redis_client):
    from scripts import demo_data

    newsletter_id = demo_data.demo_newsletter()
    assert demo_data.demo_newsletter() is None  # once
    ((status, subject, html, audience),) = factories.db.query(
        "SELECT status, subject, html, audience FROM newsletters WHERE id = %s", (newsletter_id,)
    )
    assert status == "queued" and audience["user_ids"] == sorted(u for u, *_ in demo_data.DEMO_USERS)
    compiled = template.compiled_for(newsletter_id, subject, html, None)
    assert compiled.wrapped
    out = compiled.render({**CONTEXT, "name": "Ana"})
    assert 'class="layout-card"' in out.html and "Hi Ana, here is" in out.html and out.subject.endswith(", Ana")
    anon = compiled.render({**CONTEXT, "name": ""})
    assert anon.subject == "What's new at Notify" and "Hi, here is" in anon.html
