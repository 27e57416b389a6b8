"""The subscriber pages speak the subscriber's language (issue 39): the preference centre, the
unsubscribe pages and the errors, with `lang` and `dir`; the language can be chosen on the page
(each offered in its own name); a page without a subscriber negotiates from Accept-Language; and in
the pseudo-locale no English word is left that did not come from data."""

from __future__ import annotations

import re
from html import unescape

from app.platform import db
from tests import factories
from tests.web.test_pages import csrf_from, pref_path, save_form, unsub_path


def test_a_pt_br_subscriber_s_preference_page_is_portuguese(client):
    sid = factories.subscriber(locale="pt-BR")
    r = client.get(pref_path(sid))
    html = unescape(r.text)
    assert r.status_code == 200 and r.headers["content-language"] == "pt-BR"
    assert '<html lang="pt-BR" dir="ltr">' in html
    assert "Preferências de e-mail" in html and "Salvar preferências" in html
    assert "Email preferences" not in html and "Save preferences" not in html
    # the languages on offer, each in its own name; the subscriber's selected
    assert '<option value="pt-BR" selected lang="pt-BR">Português (Brasil)</option>' in html
    assert '<option value="ar" lang="ar">العربية</option>' in html and ">日本語<" in html
    assert "segunda-feira" in html  # weekdays by CLDR


def test_choosing_arabic_on_the_page_saves_it_and_the_page_turns_right_to_left(client):
    sid = factories.subscriber()
    page = client.get(pref_path(sid))
    assert '<html lang="en" dir="ltr">' in page.text
    r = client.post(pref_path(sid), data=save_form(csrf_from(page), locale="ar"), follow_redirects=False)
    assert r.status_code == 303
    assert db.query("SELECT locale FROM subscribers WHERE id = %s", (sid,)) == [("ar",)]
    after = client.get(r.headers["location"])
    html = unescape(after.text)
    assert '<html lang="ar" dir="rtl">' in html and "تفضيلات البريد" in html
    assert "تم حفظ تفضيلاتك." in html  # the notice, in Arabic too
    # back to the deployment's default: the first choice, stored as null
    client.post(pref_path(sid), data=save_form(csrf_from(after), locale=""), follow_redirects=False)
    assert db.query("SELECT locale FROM subscribers WHERE id = %s", (sid,)) == [(None,)]


def test_a_refused_field_is_told_in_the_subscriber_s_language(client):
    sid = factories.subscriber(locale="ru")
    page = client.get(pref_path(sid))
    r = client.post(pref_path(sid), data=save_form(csrf_from(page), timezone="Mars/Olympus_Mons"))
    html = unescape(r.text)
    assert r.status_code == 422
    assert "Ничего не сохранено: исправьте ошибку" in html
    assert "Выберите часовой пояс из списка, например Europe/Lisbon." in html
    assert "must be an IANA" not in html


def test_the_unsubscribe_pages_speak_the_subscriber_s_language(client):
    sid = factories.subscriber(locale="pt-BR")
    page = unescape(client.get(unsub_path(sid, "digests")).text)
    assert '<html lang="pt-BR"' in page
    assert "Parar de enviar os e-mails de resumo para <strong>u1@example.test</strong>?" in page
    done = client.post(unsub_path(sid, "digests"), data={"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200
    assert "u1@example.test não vai mais receber e-mails de resumo." in unescape(done.text)


def test_a_page_without_a_subscriber_negotiates_from_accept_language(client):
    german = client.get("/preferences/not-a-token", headers={"Accept-Language": "de-CH, en;q=0.5"})
    assert german.status_code == 404 and '<html lang="de" dir="ltr">' in german.text
    assert "Link nicht gefunden" in unescape(german.text)
    english = client.get("/preferences/not-a-token")
    assert "Link not found" in english.text and '<html lang="en"' in english.text


def _visible_words(html: str) -> set[str]:
    visible = re.sub(r"<(style|script|datalist|select)\b.*?</\1>|<[^>]+>", " ", html, flags=re.S | re.I)
    return set(re.findall(r"[A-Za-z]{2,}", unescape(visible)))


def test_in_the_pseudo_locale_the_pages_have_no_english_left(client):
    sid = factories.subscriber(locale="en-XA", name="Rita Souza")
    factories.category_events("u1", "likes")
    # data: the subscriber's address and name, the topic, the brand, time zone names
    data = {
        "Rita",
        "Souza",
        "u1",
        "example",
        "test",
        "Likes",
        "Notify",
        "UTC",
        "Europe",
        "Lisbon",
        "America",
        "New",
        "York",
    }
    pages = [
        client.get(pref_path(sid)).text,
        client.get(unsub_path(sid)).text,
        client.get(unsub_path(sid, "newsletters")).text,
        client.post(unsub_path(sid), data={"List-Unsubscribe": "One-Click"}).text,
    ]
    for html in pages:
        assert '<html lang="en-XA" dir="ltr">' in html
        assert _visible_words(html) - data == set(), _visible_words(html) - data


def test_a_pt_pt_subscriber_s_pages_are_portuguese_from_the_pt_br_catalog(client):
    """No pt-PT catalog ships: the pages read pt-BR's words (i18n.chain: pt-PT, pt, pt-BR), not English."""
    sid = factories.subscriber(locale="pt-PT")
    r = client.get(pref_path(sid))
    html = unescape(r.text)
    assert r.status_code == 200 and r.headers["content-language"] == "pt-PT"
    assert '<html lang="pt-PT" dir="ltr">' in html
    assert "Preferências de e-mail" in html and "Salvar preferências" in html
    assert "Email preferences" not in html and "Save preferences" not in html
    page = unescape(client.get(unsub_path(sid, "digests")).text)
    assert '<html lang="pt-PT"' in page and "Unsubscribe" not in page
