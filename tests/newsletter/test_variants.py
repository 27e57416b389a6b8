"""Newsletters in several languages (issue 39, item 9, and item 2's newsletter part): `variants` by
locale tag, validated like the default (422 naming `variants.<tag>.<field>`), each recipient's chosen
by the outbox from their locale (a `pt` reader matches `pt-BR`; see app/newsletter/variants.py),
counted per variant, the test send's `locale`; the footer, unsubscribe text and `[Test]` prefix in
the variant's language, `dir="rtl"` for Arabic, and a SendGrid batch that never mixes two variants'
bodies."""

from __future__ import annotations

import re
from html import unescape

import pytest

from app.newsletter import service, template, variants
from app.platform import db, i18n
from tests import factories
from tests.conftest import auth
from tests.digest_support import sink_as_provider
from tests.newsletter_support import counts, drain, start

PT = {
    "subject": "Novidades para {{name}}",
    "html": "<p>{{greeting}} lançamos a versão 2.</p>",
}
AR = {"subject": "أخبار {{name}}", "html": "<p>{{greeting}} أطلقنا الإصدار 2.</p>"}
DEFAULT = {"subject": "News for {{name}}", "html": "<p>{{greeting}} we shipped version 2.</p>"}


def _create(client, admin_key, **extra) -> int:
    r = client.post("/v1/newsletters", json={**DEFAULT, **extra}, headers=auth(admin_key))
    assert r.status_code == 201, r.text
    return r.json()["id"]


# -- choosing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "locale,expected",
    [
        ("pt-BR", "pt-BR"),
        ("pt-PT", "pt-BR"),  # its language, `pt`, matches a variant of any region of it
        ("pt", "pt-BR"),
        ("de-CH", "de"),
        ("ar-EG", "ar"),
        ("ja", None),  # nothing on its chain: the default
        (None, None),  # DEFAULT_LOCALE (en): the default
        ("en-GB", None),  # a language never matches the pseudo-locale
        ("en-XA", "en-XA"),
    ],
)
def test_each_reader_gets_the_variant_of_their_chain(locale, expected):
    assert variants.choose(["pt-BR", "de", "ar", "en-XA"], locale) == expected


def test_a_language_s_own_variant_comes_before_a_region_s_and_default_locale_s_chain_last():
    assert variants.choose(["pt-BR", "pt"], "pt-PT") == "pt"
    assert variants.choose(["pt-BR", "pt-PT"], "pt-AO") == "pt-BR"  # several regions: the first by tag
    assert variants.choose(["en"], "ja") == "en"  # DEFAULT_LOCALE's chain: en
    assert variants.choose(["en-GB"], None) == "en-GB"


def test_with_another_default_locale_its_variant_is_everyone_s_fallback(settings):
    settings(default_locale="de")
    assert variants.choose(["de-AT", "fr"], "ja") == "de-AT"
    assert variants.choose(["de-AT", "fr"], None) == "de-AT"
    assert variants.choose(["de-AT", "fr"], "fr-CA") == "fr"


# -- the API ------------------------------------------------------------------------------------------
def test_bad_variants_are_422s_naming_them(client, admin_key):
    def errors(vs):
        r = client.post("/v1/newsletters", json={**DEFAULT, "variants": vs}, headers=auth(admin_key))
        assert r.status_code == 422, r.text
        return {e["field"]: e["message"] for e in r.json()["errors"]}

    assert set(errors({"xx-nope": PT})) == {"variants.xx-nope"}
    found = errors({"pt-BR": {"subject": "a\nb", "html": "{{nope}}", "extra": 1}})
    assert set(found) == {"variants.pt-BR.subject", "variants.pt-BR.html", "variants.pt-BR.extra"}
    assert "unknown variable 'nope'" in found["variants.pt-BR.html"]
    assert set(errors({"de": {"html": "<p>x</p>"}})) == {"variants.de.subject"}
    assert "same locale" in errors({"pt_br": PT, "pt-BR": PT})["variants"]
    tags = ["pt-BR", "pt-PT", "es", "fr", "de", "ru", "ar", "ja", "it", "nl", "pl", "sv", "da", "fi", "nb"]
    tags += ["tr", "cs", "hu", "ro", "el", "he"]
    assert len(tags) > service.MAX_VARIANTS
    assert errors(dict.fromkeys(tags, PT)) == {"variants": f"must have at most {service.MAX_VARIANTS} items"}
    big = {"subject": "s", "html": "x" * template.MAX_HTML}
    assert "characters in all" in errors(dict.fromkeys(tags[:5], big))["variants"]


def test_the_largest_valid_body_is_not_a_413(client, admin_key):
    """Every variant as large as the total allows, each character spelled in 12 bytes: a 201."""
    import json

    from app.web.api.newsletters import CREATE_BODY_LIMIT

    emoji = "\U0001f600"
    tags = ["pt-BR", "es", "fr", "de"]
    each = service.MAX_VARIANTS_CHARS // len(tags) - 10
    vs = {t: {"subject": "s", "html": emoji * (template.MAX_HTML // 2), "text": emoji * 8} for t in tags}
    assert sum(len(v["html"]) for v in vs.values()) <= each * len(tags)
    body = json.dumps({"subject": emoji * template.MAX_SUBJECT, "html": emoji * template.MAX_HTML, "variants": vs})
    assert len(body) < CREATE_BODY_LIMIT
    r = client.post("/v1/newsletters", content=body, headers={**auth(admin_key), "Content-Type": "application/json"})
    assert r.status_code == 201, r.text[:300]


# -- sending ------------------------------------------------------------------------------------------
def _people() -> dict[str, int]:
    return {
        "rita": factories.subscriber("rita", name="Rita Souza", locale="pt-BR"),
        "joao": factories.subscriber("joao", name="João Silva", locale="pt-PT"),
        "amal": factories.subscriber("amal", name="Amal Haddad", locale="ar"),
        "ken": factories.subscriber("ken", name="Ken Sato", locale="ja"),
        "ana": factories.subscriber("ana", name="Ana Lima"),
    }


def test_each_recipient_gets_their_variant_with_the_footer_in_its_language(client, admin_key, fake, provider, settings):
    settings(mail_postal_address="Rua A 1, Lisboa")
    people = _people()
    nl = _create(client, admin_key, variants={"pt-BR": PT, "ar": AR})
    start(nl)
    assert dict(db.query("SELECT subscriber_id, variant FROM email_log WHERE newsletter_id = %s", (nl,))) == {
        people["rita"]: "pt-BR",
        people["joao"]: "pt-BR",
        people["amal"]: "ar",
        people["ken"]: None,
        people["ana"]: None,
    }
    drain(nl, provider)
    assert counts(nl) == {"sent": 5}
    mails = {m["to"].split("@")[0]: m for m in fake.delivered.values()}
    rita, joao, amal, ken, ana = (mails[k] for k in ("rita", "joao", "amal", "ken", "ana"))
    assert rita["subject"] == "Novidades para Rita Souza" and joao["subject"] == "Novidades para João Silva"
    for mail in (rita, joao):
        html = unescape(mail["html"])
        assert '<html lang="pt-BR" dir="ltr">' in html and ("Olá, Rita" in html or "Olá, João" in html)
        assert "Cancelar inscrição</a>" in html and "Preferências de e-mail</a>" in html
        assert "Você recebe esta newsletter" in html and "Rua A 1, Lisboa" in html
        unsubscribe = mail["headers"]["List-Unsubscribe"].strip("<>").split(">")[0]
        assert f"Cancelar inscrição: {unsubscribe}" in mail["text"]
        assert "Unsubscribe" not in html and "Email preferences" not in mail["text"]
    html = unescape(amal["html"])
    assert amal["subject"] == "أخبار Amal Haddad"
    assert '<html lang="ar" dir="rtl">' in html and "إلغاء الاشتراك</a>" in html and "تفضيلات البريد</a>" in html
    assert "إلغاء الاشتراك: " in amal["text"] and "Unsubscribe" not in amal["text"]
    # the default content; the words the service adds in the reader's locale
    assert ken["subject"] == "News for Ken Sato" and "配信停止</a>" in unescape(ken["html"])
    assert ana["subject"] == "News for Ana Lima" and "Unsubscribe</a>" in unescape(ana["html"])
    assert "Hi Ana," in unescape(ana["html"])


def test_a_sendgrid_batch_never_shares_one_body_between_two_variants(client, admin_key, fake, provider):
    for i in range(4):
        factories.subscriber(f"pt{i}", locale="pt-BR")
        factories.subscriber(f"ar{i}", locale="ar")
        factories.subscriber(f"en{i}")
    nl = _create(client, admin_key, variants={"pt-BR": PT, "ar": AR})
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 12}
    kinds = []
    for payload in fake.requests:
        people = {p["to"][0]["email"][:2] for p in payload["personalizations"]}
        assert len(people) == 1, people  # one variant per shared body
        kinds.append(people.pop())
    assert sorted(kinds) == ["ar", "en", "pt"]  # and one request per variant, not one per mail
    for mail in fake.delivered.values():
        who = mail["to"][:2]
        words = {"pt": "Cancelar inscrição", "ar": "إلغاء الاشتراك", "en": "Unsubscribe"}[who]
        assert words in unescape(mail["html"]), mail["to"]


def test_status_counts_sent_opened_and_clicked_per_variant(client, admin_key, fake, provider):
    people = _people()
    nl = _create(client, admin_key, variants={"pt-BR": PT, "ar": AR, "de": PT})
    start(nl)
    drain(nl, provider)
    for who, kind, machine in (
        ("rita", "open", False),
        ("rita", "open", False),  # one person
        ("joao", "click", False),
        ("amal", "open", True),  # a scanner: not a person
        ("ana", "open", False),
    ):
        db.query(
            "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, is_machine) "
            "VALUES (%s, 'newsletter', %s, %s, %s)",
            (kind, nl, people[who], machine),
        )
    status = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key)).json()
    assert status["variants"] == [
        {"locale": None, "recipients": 2, "sent": 2, "opened": 1, "clicked": 0},
        {"locale": "ar", "recipients": 1, "sent": 1, "opened": 0, "clicked": 0},
        {"locale": "de", "recipients": 0, "sent": 0, "opened": 0, "clicked": 0},
        {"locale": "pt-BR", "recipients": 2, "sent": 2, "opened": 1, "clicked": 1},
    ]
    assert status["counts"]["sent"] == 5 and status["opens"]["unique_human"] == 2


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def test_the_test_send_sends_the_variant_of_its_locale_prefixed_in_its_language(client, admin_key, sink):
    factories.subscriber("amal", name="Amal Haddad", locale="ar")
    nl = _create(client, admin_key, variants={"pt-BR": PT, "ar": AR})

    def send(body):
        r = client.post(f"/v1/newsletters/{nl}/test", json=body, headers=auth(admin_key))
        assert r.status_code == 200, r.text

    send({"to": ["editor@example.test"], "locale": "pt_PT"})
    send({"to": ["amal@example.test"]})  # no locale: the subscriber's
    send({"to": ["amal@example.test"], "locale": "en"})
    subjects = [m["Subject"] for m in sink.messages()]
    assert subjects == ["[Teste] Novidades para", "[تجربة] أخبار Amal Haddad", "[Test] News for Amal Haddad"]
    editor, amal, _ = sink.messages()
    assert "Cancelar inscrição" in unescape(editor.get_body(("html",)).get_content())
    assert '<html lang="ar" dir="rtl">' in unescape(amal.get_body(("html",)).get_content())
    r = client.post(f"/v1/newsletters/{nl}/test", json={"to": ["e@x.test"], "locale": "xx-?"}, headers=auth(admin_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "locale"


# -- rendering ----------------------------------------------------------------------------------------
CONTEXT = {
    "name": "Ana",
    "email": "a@x.test",
    "user_id": "u1",
    "unsubscribe_url": "https://x.test/u/T",
    "preferences_url": "https://x.test/preferences/P",
}


def test_in_the_pseudo_locale_the_footer_has_no_untranslated_english(settings):
    compiled = template.Compiled("Ŝûƀĵéçţ", "<p>Ŵé šĥîþþéð</p>", None, "Ŕûå Å 1")
    rendered = compiled.render({**CONTEXT, "locale": i18n.PSEUDO})
    for part in (rendered.text, unescape(rendered.html)):
        visible = re.sub(r"<[^>]+>|https?://\S+", " ", part)
        assert set(re.findall(r"[A-Za-z]{2,}", visible)) == set(), visible
    assert "[Ûñšûƀšçŕîƀé" in rendered.html


def test_the_compiled_cache_keys_by_variant():
    one = template.compiled_for(999, "s", "<p>x</p>", None, "pt-BR")
    assert template.compiled_for(999, "s", "<p>x</p>", None, "pt-BR") is one
    assert template.compiled_for(999, "s", "<p>x</p>", None, "ar") is not one
    assert template.compiled_for(999, "s", "<p>x</p>", None) is not one


@pytest.mark.parametrize("default_locale", ["en", "de-AT"])
def test_the_outbox_chooses_in_one_statement_what_choose_says(client, admin_key, settings, default_locale):
    """variants.parameters() in the outbox's SQL and variants.choose() agree for every kind of tag."""
    settings(default_locale=default_locale)
    locales = [None, "pt", "pt-PT", "pt-AO", "pt-BR", "de-CH", "de", "en-GB", "en-XA", "en", "zh-Hant-TW", "zh"]
    locales += ["sr-Latn", "sr", "ja", "ar-EG", "fr-CA"]
    ids = {factories.subscriber(f"s{i}", locale=tag): tag for i, tag in enumerate(locales)}
    tags = ["pt-BR", "pt-PT", "de-AT", "en-XA", "zh-Hant", "sr-Latn", "fr"]
    nl = _create(client, admin_key, variants=dict.fromkeys(tags, PT))
    start(nl)
    chosen = dict(db.query("SELECT subscriber_id, variant FROM email_log WHERE newsletter_id = %s", (nl,)))
    assert chosen == {sid: variants.choose(tags, tag) for sid, tag in ids.items()}
    assert chosen[next(s for s, t in ids.items() if t == "pt-AO")] == "pt-BR"


def test_a_pt_pt_reader_of_the_default_content_gets_the_footer_in_portuguese_of_brazil():
    """No pt-PT catalog ships: the words the service adds come from pt-BR's (i18n.chain: pt-PT, pt,
    pt-BR, en), as variants.choose gives a pt-PT reader the pt-BR variant; de-CH still reads de."""
    compiled = template.Compiled("News", "<p>Body</p>", None, "Rua A 1, Lisboa")
    rendered = compiled.render({**CONTEXT, "locale": "pt-PT"})
    html = unescape(rendered.html)
    assert "Cancelar inscrição</a>" in html and "Preferências de e-mail</a>" in html
    assert "Você recebe esta newsletter" in html and "Unsubscribe" not in html
    assert "Cancelar inscrição: https://x.test/u/T" in rendered.text
    swiss = unescape(compiled.render({**CONTEXT, "locale": "de-CH"}).html)
    assert "Abmelden</a>" in swiss and "Unsubscribe" not in swiss


def test_the_list_shows_each_newsletter_s_variant_locales(client, admin_key):
    """GET /v1/newsletters names each newsletter's variants (their tags, without their bodies);
    GET /v1/newsletters/{id} counts them."""
    several = _create(client, admin_key, variants={"pt-BR": PT, "ar": AR, "de": PT})
    plain = _create(client, admin_key)
    r = client.get("/v1/newsletters", headers=auth(admin_key))
    assert r.status_code == 200, r.text
    shown = {n["id"]: n["variant_locales"] for n in r.json()["newsletters"]}
    assert shown == {several: ["ar", "de", "pt-BR"], plain: []}
    status = client.get(f"/v1/newsletters/{several}", headers=auth(admin_key)).json()
    assert status["variant_locales"] == ["ar", "de", "pt-BR"]
    assert [v["locale"] for v in status["variants"]] == [None, "ar", "de", "pt-BR"]
