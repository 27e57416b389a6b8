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


# -- the mail budget and where quiet hours move the next digest (items 2, 4, 6) ----------------------
def _budget(sid: int):
    return db.query("SELECT max_mails_per_day FROM subscribers WHERE id = %s", (sid,))[0][0]


def test_the_budget_is_shown_chosen_and_kept_on_the_page(client, settings):
    settings(default_max_mails_per_day=4)
    sid = factories.subscriber(timezone=ZONE)
    page = client.get(pref_path(sid))
    assert "<legend>Most emails a day</legend>" in page.text
    assert '<option value="" selected>Default (4)</option>' in page.text
    assert "Today so far: 0 of 4." in page.text
    form = save_form(csrf_from(page), timezone=ZONE, max_mails_per_day="3")
    assert client.post(pref_path(sid), data=form, follow_redirects=False).status_code == 303
    assert _budget(sid) == 3
    again = client.get(pref_path(sid))
    assert '<option value="3" selected>3</option>' in again.text and "Today so far: 0 of 3." in again.text
    no_limit = save_form(csrf_from(again), timezone=ZONE, max_mails_per_day="0")
    assert client.post(pref_path(sid), data=no_limit, follow_redirects=False).status_code == 303
    assert _budget(sid) == 0 and "Today so far" not in client.get(pref_path(sid)).text


def test_a_budget_the_api_set_is_offered_so_saving_the_page_keeps_it(client):
    sid = factories.subscriber(timezone=ZONE, max_mails_per_day=7, locale="de")
    page = client.get(pref_path(sid))
    assert '<option value="7" selected>7</option>' in page.text
    assert "Heute bisher: 0 von 7." in page.text
    assert (
        client.post(
            pref_path(sid),
            data=save_form(csrf_from(page), timezone=ZONE, max_mails_per_day="7"),
            follow_redirects=False,
        ).status_code
        == 303
    )
    assert _budget(sid) == 7


def test_a_budget_not_a_number_is_refused_and_nothing_saved(client):
    sid = factories.subscriber(timezone=ZONE, max_mails_per_day=2)
    page = client.get(pref_path(sid))
    for bad in ("many", "-1", "5000"):
        r = client.post(pref_path(sid), data=save_form(csrf_from(page), timezone=ZONE, max_mails_per_day=bad))
        assert r.status_code == 422 and "Choose a number from the list." in r.text
    assert _budget(sid) == 2


def test_a_digest_slot_inside_quiet_hours_is_announced_at_their_end(client):
    from datetime import datetime
    from zoneinfo import ZoneInfo

    hour = (datetime.now(ZoneInfo(ZONE)).hour + 3) % 24  # the slot, inside a window from 2 h to 5 h ahead
    window = _stored(around_now(-2, 5))
    sid = factories.subscriber(timezone=ZONE, digest_hour=hour, quiet_hours=window)
    page = client.get(pref_path(sid))
    saved = client.post(
        pref_path(sid),
        data=save_form(
            csrf_from(page), timezone=ZONE, digest_hour=str(hour), quiet_start=window[:5], quiet_end=window[6:]
        ),
    )
    end = window[6:]
    assert "when your quiet hours end." in unescape(saved.text) and f"{end} {ZONE}" in unescape(saved.text)
