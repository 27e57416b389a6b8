"""Quiet hours on the preference page (issue 40, item 6): set and cleared there, refused when half
set, and while they hold the page says until when (in the subscriber's words and zone)."""

from __future__ import annotations

from html import unescape

from app.platform import db
from tests import factories
from tests.digest.test_quiet_hours_hold import ZONE, _stored, around_now, away_from_now
from tests.web.test_pages import csrf_from, pref_path, save_form


def _quiet(sid: int):
    return db.query("SELECT quiet_hours FROM subscribers WHERE id = %s", (sid,))[0][0]


def test_quiet_hours_are_set_and_cleared_on_the_page(client):
    sid = factories.subscriber(timezone=ZONE)
    page = client.get(pref_path(sid))
    assert 'id="quiet_start"' in page.text and "<legend>Quiet hours</legend>" in page.text
    form = save_form(csrf_from(page), timezone=ZONE, quiet_start="22:00", quiet_end="07:00")
    assert client.post(pref_path(sid), data=form, follow_redirects=False).status_code == 303
    assert _quiet(sid) == "22:00-07:00"
    again = client.get(pref_path(sid))
    assert '<option value="22:00" selected>22:00</option>' in again.text
    cleared = save_form(csrf_from(again), timezone=ZONE, quiet_start="", quiet_end="")
    assert client.post(pref_path(sid), data=cleared, follow_redirects=False).status_code == 303
    assert _quiet(sid) is None


def test_half_a_window_is_refused_and_nothing_saved(client):
    sid = factories.subscriber(timezone=ZONE, quiet_hours="22:00-07:00")
    page = client.get(pref_path(sid))
    r = client.post(pref_path(sid), data=save_form(csrf_from(page), timezone=ZONE, quiet_start="23:00", quiet_end=""))
    assert r.status_code == 422 and "Choose both times, and two different ones, or neither." in r.text
    assert _quiet(sid) == "22:00-07:00"


def test_while_quiet_hours_hold_the_page_says_until_when(client):
    sid = factories.subscriber(timezone=ZONE, quiet_hours=_stored(around_now()), locale="pt-BR")
    html = unescape(client.get(pref_path(sid)).text)
    assert "Horário de silêncio agora: o que vier espera até" in html and ZONE in html
    awake = factories.subscriber("awake", timezone=ZONE, quiet_hours=_stored(away_from_now()))
    assert "Quiet hours now" not in client.get(pref_path(awake)).text
