"""Categories in every language (issue 39, item 5): PUT /v1/categories/{key} takes `translations` by
locale tag (normalised; a bad tag, a bad field or too many locales is a 422 naming it), GET returns
them, and a digest line takes the reader's translation along their fallback chain (de-CH -> de),
else the category's own words; a translated verb is used as written (no English preposition rule)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from html import unescape

from babel import localedata

from app.platform import i18n
from app.subscribers import categories
from digest import context, group, wording
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.digest_support import sink_as_provider

LIKE = {
    "label": "Likes",
    "verb": "liked",
    "translations": {
        "pt_br": {"label": "Curtidas", "verb": "curtiu", "description": "Quando alguém curte um post seu"},
        "de": {"label": "Gefällt mir", "verb": "gefällt"},
    },
}
COMMENT = {
    "label": "Comments",
    "verb": "commented on",
    "translations": {"pt-BR": {"label": "Comentários", "verb": "comentou em"}, "fr": {"label": "Commentaires"}},
}


def put(client, key, key_body, api_key):
    return client.put(f"/v1/categories/{key}", json=key_body, headers=auth(api_key))


def test_translations_are_stored_by_normalised_tag_and_returned(client, admin_key):
    r = put(client, "like", LIKE, admin_key)
    assert r.status_code == 201, r.text
    assert r.json()["translations"] == {
        "pt-BR": {"label": "Curtidas", "verb": "curtiu", "description": "Quando alguém curte um post seu"},
        "de": {"label": "Gefällt mir", "verb": "gefällt", "description": ""},
    }
    assert client.get("/v1/categories/like", headers=auth(admin_key)).json() == r.json()
    # PUT replaces the whole record: translations left out are gone
    r = put(client, "like", {"label": "Likes"}, admin_key)
    assert r.status_code == 200 and r.json()["translations"] == {}
    assert categories.registry()["like"].translations == ()


def test_a_bad_translation_is_a_422_naming_it(client, admin_key):
    def errors(body):
        r = put(client, "like", {"label": "Likes", **body}, admin_key)
        assert r.status_code == 422, r.text
        return {e["field"]: e["message"] for e in r.json()["errors"]}

    assert set(errors({"translations": {"xx-nope": {"label": "X"}}})) == {"translations.xx-nope"}
    found = errors({"translations": {"pt-BR": {"label": " ", "verb": "a\nb", "extra": 1}}})
    assert set(found) == {"translations.pt-BR.label", "translations.pt-BR.verb", "translations.pt-BR.extra"}
    assert set(errors({"translations": {"de": {"verb": "gefällt"}}})) == {"translations.de.label"}
    assert "same locale" in errors({"translations": {"pt_br": {"label": "A"}, "pt-BR": {"label": "B"}}})["translations"]
    many = {tag: {"label": "L"} for tag in _tags(categories.MAX_TRANSLATIONS + 1)}
    assert errors({"translations": many}) == {"translations": f"must have at most {categories.MAX_TRANSLATIONS} items"}
    assert errors({"translations": ["pt-BR"]}) == {"translations": "must be a JSON object"}


def _tags(n: int) -> list[str]:
    """n distinct locale tags Babel knows."""
    tags = list(dict.fromkeys(i18n.normalize(t) for t in sorted(localedata.locale_identifiers())))
    assert len(tags) >= n
    return tags[:n]


def test_the_largest_valid_body_is_not_a_413(client, admin_key):
    emoji = "\U0001f600"
    words = {"label": emoji * 100, "description": emoji * 500, "verb": emoji * 60}
    body = {**words, "delivery": "immediate", "translations": dict.fromkeys(_tags(categories.MAX_TRANSLATIONS), words)}
    raw = json.dumps(body)  # ensure_ascii: every emoji is 12 bytes
    r = client.put("/v1/categories/big", content=raw, headers={**auth(admin_key), "Content-Type": "application/json"})
    assert r.status_code == 201, (len(raw), r.text[:300])


def _line(registry: dict, locale: str | None, key: str = "like", names=("Ana", "Bo", "Cy")) -> str:
    now = datetime(2026, 3, 10, 9, tzinfo=UTC)
    events = [group.Event(i, key, "post", "p1", f"a{i}", n, now) for i, n in enumerate(names)]
    digest = group.build(events, 1)
    ctx = context.build(
        digest,
        context.Reader(
            name="Rita",
            cadence="daily",
            timezone="UTC",
            last_digest_at=now - timedelta(days=1),
            unsubscribe_url="https://x.test/u/T",
            preferences_url="https://x.test/preferences/T",
            locale=locale,
        ),
        categories=registry,
        now=now + timedelta(minutes=5),
    )
    line = ctx["groups"][0]["lines"][0]
    return f"{line['label']}|{line['summary']}|{ctx['headline']}"


def test_a_digest_line_takes_the_reader_s_translation_then_the_chain_then_the_default(client, admin_key):
    put(client, "like", LIKE, admin_key)
    put(client, "comment", COMMENT, admin_key)
    reg = categories.registry()
    assert _line(reg, "pt-BR") == "Curtidas|Ana, Bo e Cy curtiu|Ana, Bo e Cy curtiu Post p1"
    # de-CH has no translation of its own: its language's (i18n.chain), with de-CH's words around it
    assert _line(reg, "de-CH").startswith("Gefällt mir|Ana, Bo und Cy gefällt")
    # a locale without a translation anywhere on its chain: the category's own words
    assert _line(reg, "ja").startswith("Likes|Ana、Bo、Cyがliked")
    assert _line(reg, None) == "Likes|Ana, Bo and Cy liked|Ana, Bo and Cy liked Post p1"
    # a translated verb keeps its preposition inside the entity's block; the English one loses it
    assert _line(reg, "pt-BR", "comment", ("Ana",)).split("|")[1] == "Ana comentou em"
    assert _line(reg, "en", "comment", ("Ana",)).split("|")[1] == "Ana commented"
    # a translation without a verb words the line with its label, in its language
    assert _line(reg, "fr", "comment", ("Ana",)).split("|")[:2] == ["Commentaires", "Commentaires de Ana"]


def test_lookup_gives_the_words_of_a_locale_and_an_unknown_key_its_humanised_one():
    like = categories.Category("like", "Likes", verb="liked", translations=(("de", "Gefällt mir", "", "gefällt"),))
    reg = {"like": like}
    assert categories.lookup("like", reg, "de-AT").label == "Gefällt mir"
    assert categories.lookup("like", reg, "de-AT").locale == "de"
    assert categories.lookup("like", reg, "fr") is like and categories.lookup("like", reg) is like
    assert categories.lookup("new_thing", reg, "de").label == "New thing"
    t = i18n.translator("de")
    assert wording.line_text(categories.lookup("like", reg, t.tag), ["Eli"], 1, t) == "Eli gefällt"


def test_a_pt_br_subscriber_s_mailed_digest_names_the_category_in_portuguese(client, admin_key, settings):
    put(client, "like", LIKE, admin_key)
    with sink_as_provider(settings) as sink:
        sid = factories.subscriber("rita", name="Rita Souza", locale="pt-BR")
        factories.events("rita", 2, entity_id="p1", category="like")
        assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
        (mail,) = sink.messages()
    text = mail.get_body(("plain",)).get_content()
    html = unescape(mail.get_body(("html",)).get_content())
    assert "curtiu" in text and "curtiu" in html and "liked" not in text
