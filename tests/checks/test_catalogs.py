"""The catalogs cannot break the build (issue 39, item 10): every shipped catalog has every message
of the code, translated, with the source's placeholders and CLDR's plural forms for its locale; the
template and the pseudo-locale are what scripts/dev/messages.py makes of the code. A missing message
or a `{count}` typo fails here, and the check itself is shown to catch both."""

from __future__ import annotations

from babel.messages.catalog import Catalog

from app.platform import i18n
from scripts.dev import messages


def test_the_catalogs_are_current_with_the_code():
    stale = [path for path, content in messages.wanted().items() if not path.exists() or path.read_bytes() != content]
    assert stale == [], "run `make messages` and translate what it leaves empty"


def test_every_shipped_catalog_is_complete_and_well_formed():
    assert messages.shipped_problems() == []
    assert set(i18n.SHIPPED) - {i18n.SOURCE} == {p.stem for p in i18n.CATALOG_DIR.glob("*.po")} - {i18n.PSEUDO}


def _catalog(tag: str, strings: dict) -> Catalog:
    catalog = Catalog(locale=tag.replace("-", "_"))
    messages._plural_header(catalog, tag)
    for msgid, string in strings.items():
        catalog.add(msgid, string)
    return catalog


def test_a_missing_message_a_typo_and_wrong_plural_forms_are_caught():
    template = Catalog()
    template.add("Hi {name},")
    template.add(("{count} update", "{count} updates"))
    template.add("Unsubscribe")
    broken = _catalog("ru", {"Hi {name},": "Здравствуйте, {nmae}!", ("{count} update", "{count} updates"): ("a", "b")})
    found = messages.problems(broken, "ru", template)
    assert any("'Unsubscribe' is missing" in p for p in found), found
    assert any("placeholders ['{nmae}']" in p for p in found), found
    assert any("2 plural forms, CLDR gives ru 4" in p for p in found), found
    typo = _catalog("de", {("{count} update", "{count} updates"): ("{count} Neuigkeit", "{cuont} Neuigkeiten")})
    assert any("{cuont}" in p for p in messages.problems(typo, "de", template))


def test_a_plural_form_may_say_one_in_words_but_other_forms_keep_the_count():
    template = Catalog()
    template.add(("{count} update", "{count} updates"))
    ar = ("لا تحديثات", "تحديث واحد", "تحديثان", "{count} تحديثات", "{count} تحديثًا", "{count} تحديث")
    assert messages.problems(_catalog("ar", {("{count} update", "{count} updates"): ar}), "ar", template) == []
    few_without = (*ar[:3], "تحديثات", *ar[4:])
    found = messages.problems(_catalog("ar", {("{count} update", "{count} updates"): few_without}), "ar", template)
    assert found and "placeholders" in found[0]


def test_the_pseudo_locale_is_accented_longer_and_bracketed():
    source = "{count} more updates on {things}"
    shown = messages.pseudo(source)
    assert shown.startswith("[") and shown.endswith("]") and "{count}" in shown and "{things}" in shown
    words = len(source) - len("{count}{things}")
    assert "more" not in shown and len(shown) - len("{count}{things}") >= words * 1.35
