"""Every subscriber's language (issue 39): counts take every CLDR form in ru and ar, lists follow the
locale's pattern, numbers its separators, a message a locale lacks falls back alone (counted, logged
once), and a pt-BR subscriber's digest goes out in Portuguese through the real send path, an ar
subscriber's right to left."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from zoneinfo import ZoneInfo

import pytest

from app.platform import i18n, metrics
from app.subscribers.categories import Category
from digest import context, group, wording
from digest import send as digest_send
from tests import factories
from tests.digest_support import sink_as_provider

UPDATES = ("{count} update", "{count} updates")


@pytest.mark.parametrize(
    "count,expected",
    [
        (1, "1 обновление"),
        (2, "2 обновления"),
        (5, "5 обновлений"),
        (21, "21 обновление"),
        (22, "22 обновления"),
        (25, "25 обновлений"),
        (111, "111 обновлений"),
    ],
)
def test_russian_counts_take_one_few_and_many(count, expected):
    assert i18n.translator("ru").ngettext(*UPDATES, count) == expected


@pytest.mark.parametrize(
    "count,expected",
    [
        (0, "لا تحديثات"),  # zero
        (1, "تحديث واحد"),  # one
        (2, "تحديثان"),  # two
        (3, "3 تحديثات"),  # few
        (11, "11 تحديثًا"),  # many
        (100, "100 تحديث"),  # other
    ],
)
def test_arabic_counts_take_all_six_forms(count, expected):
    shown = i18n.translator("ar").ngettext(*UPDATES, count)
    # Arabic writes its own digits (CLDR's default numbering for ar): compare the words, then the number
    digits = i18n.translator("ar").number(count)
    assert shown == expected.replace(str(count), digits)


@pytest.mark.parametrize(
    "tag,counts",
    [
        ("ru", {1: "one", 2: "few", 5: "many", 21: "one", 22: "few", 25: "many", 111: "many"}),
        ("ar", {0: "zero", 1: "one", 2: "two", 3: "few", 11: "many", 100: "other"}),
        ("pl", {1: "one", 2: "few", 5: "many", 21: "many", 22: "few", 25: "many", 111: "many"}),
        ("ja", {0: "other", 1: "other", 2: "other", 111: "other"}),
    ],
)
def test_the_form_of_a_count_is_cldr_s_category(tag, counts):
    locale = i18n.translator(tag).locale
    categories = [c for c in i18n.CATEGORIES if c in locale.plural_form.tags or c == "other"]
    assert {n: categories[i18n.plural_index(locale, n)] for n in counts} == counts
    assert i18n.forms(tag) == len(categories)


def test_japanese_has_one_form_for_every_count():
    t = i18n.translator("ja")
    assert [t.ngettext(*UPDATES, n) for n in (1, 2, 5)] == ["1件の更新", "2件の更新", "5件の更新"]


def test_actor_lists_follow_the_locale_s_pattern():
    assert wording.actors_text(["Ana", "Bo", "Cy"], t=i18n.translator("pt-BR")) == "Ana, Bo e Cy"
    assert wording.actors_text(["Ana", "Bo", "Cy", "Dee", "Eli"], t=i18n.translator("pt-BR")) == (
        "Ana, Bo e mais 3 pessoas"
    )
    assert wording.actors_text(["Ana", "Bo", "Cy"]) == "Ana, Bo and Cy"
    assert wording.actors_text(["Ana", "Bo"], t=i18n.translator("ja")) == "Ana、Bo"


def test_numbers_dates_and_relative_times_are_the_locale_s():
    de = i18n.translator("de")
    assert de.number(12345) == "12.345"
    assert i18n.translator("en").number(12345) == "12,345"
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    lisbon = ZoneInfo("Europe/Lisbon")
    assert wording.relative_time(now - timedelta(days=10), now, lisbon, de) == "28. Feb."
    assert wording.relative_time(now - timedelta(days=1), now, lisbon, i18n.translator("pt-BR")) == "ontem às 12:00"
    assert wording.since(now - timedelta(days=30), now, lisbon, i18n.translator("fr")) == "depuis le 8 février"
    assert i18n.translator("fr").ago(3 * 3600) == "il y a 3 heures"


def test_a_locale_is_normalised_and_an_unknown_one_refused():
    assert i18n.normalize("pt_br") == i18n.normalize("pt-br") == i18n.normalize("PT-BR") == "pt-BR"
    for bad in ("xx", "de-", "", "en US", "a" * 40, 42):
        with pytest.raises(i18n.LocaleError):
            i18n.normalize(bad)


def test_pages_without_a_subscriber_negotiate_from_accept_language():
    assert i18n.negotiate("pt-PT,pt;q=0.9,en;q=0.8") == "pt-BR"
    assert i18n.negotiate("de-CH, fr;q=0.5") == "de"
    assert i18n.negotiate("xx, es-MX;q=0.3") == "es"
    assert i18n.negotiate(None) == "en" and i18n.negotiate("*") == "en"


def test_the_fallback_chain_goes_message_by_message_and_counts(caplog):
    assert i18n.chain("de-CH") == ("de-CH", "de", "en")
    assert i18n.translator("de-CH").gettext("Unsubscribe") == "Abmelden"  # its language's words
    # pt-BR without one message: that message alone falls back, counted and logged once
    full = i18n.catalog("pt-BR")
    kept = {k: v for k, v in full.strings.items() if k != "Unsubscribe"}
    lacking = i18n._Messages("pt-BR", full.locale, kept, full.identifier)
    i18n._catalogs["pt-BR"] = lacking
    try:
        t = i18n.Translator("pt-BR")
        before = metrics.I18N_FALLBACKS.labels("pt-BR")._value.get()
        with caplog.at_level(logging.WARNING, "app.platform.i18n"):
            assert t.gettext("Unsubscribe") == "Unsubscribe" and t.gettext("Unsubscribe") == "Unsubscribe"
        assert t.gettext("View in your browser") == "Ver no navegador"
        assert metrics.I18N_FALLBACKS.labels("pt-BR")._value.get() == before + 2
        assert sum("'Unsubscribe'" in r.message for r in caplog.records) == 1
    finally:
        i18n._catalogs["pt-BR"] = full


def _digest_context(locale: str | None, cadence: str = "daily") -> dict:
    now = datetime(2026, 3, 10, 9, tzinfo=UTC)
    events = [group.Event(i, "like", "post", "p1", f"a{i}", n, now) for i, n in enumerate(("Ana", "Bo", "Cy"))]
    events.append(group.Event(3, "comment", "post", "p2", "a0", "Ana", now))
    digest = group.build(events, 1)
    return context.build(
        digest,
        context.Reader(
            name="Rita Souza",
            cadence=cadence,
            timezone="America/Sao_Paulo",
            last_digest_at=now - timedelta(days=2),
            unsubscribe_url="https://x.test/u/T",
            preferences_url="https://x.test/preferences/T",
            locale=locale,
        ),
        categories={"like": Category("like", "Curtidas", verb="curtiu")},
        now=now + timedelta(minutes=5),
    )


def test_a_digest_context_speaks_the_reader_s_language():
    pt = _digest_context("pt-BR")
    assert (pt["lang"], pt["dir"]) == ("pt-BR", "ltr")
    assert pt["heading"] == "Olá, Rita, aqui está o seu resumo diário"
    assert pt["lead"] == "4 atualizações desde domingo."
    assert pt["groups"][0]["lines"][0]["summary"] == "Ana, Bo e Cy curtiu"
    assert pt["unsubscribe"] == "Cancelar inscrição"
    ar = _digest_context("ar")
    assert (ar["lang"], ar["dir"]) == ("ar", "rtl")
    assert _digest_context(None)["heading"] == "Hi Rita, here is your daily digest"


def test_a_pt_br_subscriber_gets_a_portuguese_digest_and_an_ar_one_right_to_left(settings):
    with sink_as_provider(settings) as sink:
        for user, locale in (("rita", "pt-BR"), ("amal", "ar")):
            sid = factories.subscriber(user, name="Rita Souza", locale=locale)
            factories.events(user, 3, entity_id="p1")
            assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
        by_to = {m["To"].addresses[0].addr_spec: m for m in sink.messages()}
    rita = by_to["rita@example.test"]
    # the HTML part is ASCII, its other characters entities (app/platform/mail.py ascii_html)
    html, text = unescape(rita.get_body(("html",)).get_content()), rita.get_body(("plain",)).get_content()
    assert '<html lang="pt-BR" dir="ltr">' in html
    assert "Olá, Rita, aqui está o seu resumo diário" in text and "Cancelar inscrição" in html
    assert "Seu primeiro resumo: 3 atualizações." in text
    assert "Unsubscribe" not in html and "Hi Rita" not in text
    amal = unescape(by_to["amal@example.test"].get_body(("html",)).get_content())
    assert '<html lang="ar" dir="rtl">' in amal and "إلغاء الاشتراك" in amal


def test_in_the_pseudo_locale_no_english_word_is_left_that_did_not_come_from_data():
    """en-XA accents every catalog message: a plain word left in the rendered digest is English that
    never went through a catalog (data aside: names, titles, the category's label and verb, URLs)."""
    from digest import render

    ctx = _digest_context("en-XA")
    rendered = render.render(ctx)
    data = {"Rita", "Ana", "Bo", "Cy", "Curtidas", "curtiu", "Post", "p1", "p2", "Comment", "Like", "Notify"}  # + brand
    for part in (rendered.subject, rendered.text, unescape(rendered.html)):
        visible = re.sub(r"<style.*?</style>|<[^>]+>|https?://\S+", " ", part, flags=re.S)
        words = set(re.findall(r"[A-Za-z]{2,}", visible)) - data
        assert words == set(), (words, visible[:500])
    assert '<html lang="en-XA" dir="ltr">' in rendered.html


def test_the_feed_words_its_items_in_the_subscriber_s_language():
    from digest import feed

    factories.subscriber("fr-reader", locale="fr")
    factories.events("fr-reader", 3, entity_id="p1")
    subscriber = feed.find("fr-reader")
    later = datetime.now(UTC) + timedelta(hours=3, minutes=5)
    (item,) = feed.page(subscriber, now=later)["items"]
    assert item["count_label"] == "3 nouveautés"
    assert item["lines"][0]["when"] == "il y a 3 h"
    assert " et " in item["lines"][0]["summary"]  # the French list pattern


def test_a_translator_keeps_what_it_looked_up_but_counts_every_fallback():
    """Speed (item 11): a message and a count's plural form are resolved once per translator; a
    fallback is never kept, so it is counted on every use."""
    ru = i18n.Translator("ru")
    for _ in range(2):
        assert [ru.ngettext("{count} update", "{count} updates", n) for n in (1, 2, 5, 21)] == [
            "1 обновление",
            "2 обновления",
            "5 обновлений",
            "21 обновление",
        ]
        assert ru.gettext("Unsubscribe") == i18n.catalog("ru").strings["Unsubscribe"]
    full = i18n.catalog("ru")
    kept = {k: v for k, v in full.strings.items() if k != "{count} update"}
    i18n._catalogs["ru"] = i18n._Messages("ru", full.locale, kept, full.identifier)
    try:
        t = i18n.Translator("ru")
        before = metrics.I18N_FALLBACKS.labels("ru")._value.get()
        assert [t.ngettext("{count} update", "{count} updates", 2) for _ in range(3)] == ["2 updates"] * 3
        assert metrics.I18N_FALLBACKS.labels("ru")._value.get() == before + 3
    finally:
        i18n._catalogs["ru"] = full


def test_every_locale_writes_the_digest_html_as_ascii_html_would():
    """digest.html is written in ASCII as it renders (mustache ascii=True): the same bytes as
    mail.ascii_html of the plain render, in every shipped locale, the pseudo-locale and a fallback."""
    from app.platform import mail
    from digest import render

    ts = render.TemplateSet(render.DEFAULT_DIR)
    assert ts.get("digest.html").ascii is not None
    for locale in (*i18n.SHIPPED, i18n.PSEUDO, "de-CH", "pt-PT", None):
        _, html, ctx = ts.render_html(_digest_context(locale))
        assert html == mail.ascii_html(ts.get("digest.html").template.render(ctx)) and html.isascii(), locale


def test_a_language_without_its_own_catalog_reads_a_shipped_region_of_it():
    """pt-PT has no catalog: its words are pt-BR's (as newsletter variants choose), before
    DEFAULT_LOCALE; its dates and numbers stay its own. A reader of another region's catalog is no
    fallback of a shipped catalog: nothing is counted."""
    assert i18n.chain("pt-PT") == ("pt-PT", "pt", "pt-BR", "en")
    assert i18n.chain("pt") == ("pt", "pt-BR", "en")
    assert i18n.chain("es-MX") == ("es-MX", "es", "en")  # its language's own catalog first
    assert i18n.chain("de-CH") == ("de-CH", "de", "en") and i18n.chain("en-GB") == ("en-GB", "en")
    assert i18n.chain("ja") == ("ja", "en")
    before = metrics.I18N_FALLBACKS.labels("pt-PT")._value.get()
    pt = _digest_context("pt-PT")
    assert metrics.I18N_FALLBACKS.labels("pt-PT")._value.get() == before
    assert (pt["lang"], pt["dir"]) == ("pt-PT", "ltr")
    assert pt["heading"] == "Olá, Rita, aqui está o seu resumo diário"
    assert pt["lead"] == "4 atualizações desde domingo."
    assert pt["unsubscribe"] == "Cancelar inscrição" and pt["view_in_browser"] == "Ver no navegador"
    assert pt["groups"][0]["lines"][0]["summary"] == "Ana, Bo e Cy curtiu"
    assert i18n.translator("pt-PT").number(12345) == "12\xa0345"  # pt-PT's grouping, not pt-BR's 12.345
    assert i18n.translator("es-MX").gettext("Unsubscribe") == i18n.translator("es").gettext("Unsubscribe")
    assert _digest_context("de-CH")["unsubscribe"] == "Abmelden"


def test_with_another_default_locale_a_reader_falls_back_through_its_language_too(settings):
    settings(default_locale="pt-PT")
    assert i18n.chain("ja") == ("ja", "pt-PT", "pt", "pt-BR", "en")
    assert i18n.chain("de-CH") == ("de-CH", "de", "pt-PT", "pt", "pt-BR", "en")
