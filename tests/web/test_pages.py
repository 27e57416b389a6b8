"""Preference centre and unsubscribe pages over the real app (TestClient), real Postgres."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from app.platform import db, tokens
from app.subscribers import categories
from app.subscribers import records as subscribers
from tests import factories

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


# ---------------------------------------------------------------- helpers


def row(subscriber_id: int) -> dict:
    cols = (
        "digest_cadence",
        "digest_hour",
        "digest_weekday",
        "timezone",
        "category_opt_outs",
        "paused_until",
        "unsubscribed_at",
        "updated_at",
    )
    return dict(zip(cols, db.query(f"SELECT {', '.join(cols)} FROM subscribers WHERE id = %s", (subscriber_id,))[0]))


def pref_path(subscriber_id: int) -> str:
    return "/preferences/" + tokens.make("preferences", subscriber_id, 1)


def unsub_path(subscriber_id: int, scope=None) -> str:
    return "/u/" + tokens.make("unsubscribe", subscriber_id, 1, scope)


def csrf_from(response) -> str:
    match = CSRF_RE.search(response.text)
    assert match, "page has no CSRF token"
    return match.group(1)


def save_form(csrf: str, **overrides) -> dict:
    form = {
        "csrf_token": csrf,
        "action": "save",
        "digest_cadence": "daily",
        "digest_hour": "9",
        "digest_weekday": "0",
        "timezone": "UTC",
        "pause_days": "",
    }
    form.update(overrides)
    return form


@pytest.fixture
def sub():
    return factories.subscriber()


# ---------------------------------------------------------------- preference centre: GET


def test_preferences_page_shows_current_settings_accessibly(client, sub):
    factories.category_events("u1", "likes", "comments")
    subscribers.update(
        sub,
        {"category_opt_outs": ["mentions"], "digest_cadence": "weekly", "digest_hour": 7, "timezone": "Europe/Lisbon"},
    )
    r = client.get(pref_path(sub))
    assert r.status_code == 200
    html = r.text
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert 'id="cadence-weekly" value="weekly" checked' in html
    assert '<option value="7" selected>07:00</option>' in html
    assert 'value="Europe/Lisbon"' in html and '<datalist id="timezone-list">' in html
    assert '<option value="America/New_York"></option>' in html
    # topics: event categories ticked, the opt-out shown unticked; unregistered ones by their humanised key
    for i, label in enumerate(["Comments", "Likes", "Mentions"], start=1):
        assert f'<label for="category-{i}">{label}</label>' in html
    assert 'value="comments" checked' in html and 'value="likes" checked' in html
    assert 'value="mentions">' in html
    # accessibility basics: every control has a label, groups have legends
    assert html.count("<fieldset") == html.count("<legend>") >= 4
    for control_id in ("digest_hour", "digest_weekday", "timezone", "pause_days"):
        assert f'<label for="{control_id}">' in html
    # CSRF cookie: HttpOnly, SameSite=Strict
    cookie = r.headers["set-cookie"].lower()
    assert "notify_csrf=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    # token-bearing page: not cached, no referrer, not framed
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


def test_csrf_cookie_is_secure_behind_https(client, settings, sub):
    assert "secure" not in client.get(pref_path(sub)).headers["set-cookie"].lower()  # plain-http dev
    client.cookies.clear()
    settings(base_url="https://notify.example")
    assert "secure" in client.get(pref_path(sub)).headers["set-cookie"].lower()


def test_csrf_nonce_is_reused_across_pages(client, sub):
    first = client.get(pref_path(sub))
    # the browser has the nonce now: the next page reuses it (forms in other tabs stay valid)
    assert "set-cookie" not in client.get(unsub_path(sub)).headers
    second = client.get(pref_path(sub))
    assert "set-cookie" not in second.headers
    assert csrf_from(first) == csrf_from(second)


def test_categories_include_already_sent_events(client, sub):
    run_id = factories.digest_run(sub, status="sent")
    factories.category_events("u1", "old-topic", run_id=run_id)
    factories.category_events("someone-else", "not-mine")
    html = client.get(pref_path(sub)).text
    assert 'value="old-topic"' in html and "not-mine" not in html and "Not mine" not in html


def test_topics_show_registered_labels_and_descriptions(client, sub):
    categories.upsert(
        "comment",
        {
            "label": "Replies to you",
            "description": "When someone answers your post",
            "verb": "replied to",
            "delivery": "digest",
        },
    )
    categories.upsert("zz_news", {"label": "Announcements", "description": "", "verb": "", "delivery": "immediate"})
    factories.category_events("u1", "comment", "new_follower")
    html = client.get(pref_path(sub)).text
    # ordered by label; a registered category is offered before the subscriber has any of its events
    labels = re.findall(r'<label for="category-\d+">([^<]*)</label>', html)
    assert labels == ["Announcements", "New follower", "Replies to you"]
    assert 'value="comment" checked aria-describedby="category-3-hint"' in html
    assert '<p class="hint" id="category-3-hint">When someone answers your post</p>' in html
    assert ">comment<" not in html and ">new_follower<" not in html  # never the raw key


def test_static_stylesheet_is_served(client, sub):
    html = client.get(pref_path(sub)).text
    css_url = re.search(r'<link rel="stylesheet" href="([^"]+)">', html).group(1)
    r = client.get(css_url)
    assert r.status_code == 200 and "text/css" in r.headers["content-type"]
    assert "@media" in r.text  # responsive rules


# ---------------------------------------------------------------- preference centre: POST


def test_save_updates_row_and_redirects_with_notice(client, sub):
    factories.category_events("u1", "likes", "comments")
    page = client.get(pref_path(sub))
    form = save_form(
        csrf_from(page),
        digest_cadence="weekly",
        digest_hour="18",
        digest_weekday="4",
        timezone="America/New_York",
        shown_category=["comments", "likes"],
        category=["likes"],
    )
    r = client.post(pref_path(sub), data=form, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == pref_path(sub) + "?notice=saved"
    saved = row(sub)
    assert (saved["digest_cadence"], saved["digest_hour"], saved["digest_weekday"], saved["timezone"]) == (
        "weekly",
        18,
        4,
        "America/New_York",
    )
    assert saved["category_opt_outs"] == ["comments"]
    shown = client.get(r.headers["location"])
    assert "Your preferences are saved" in shown.text
    assert 'value="comments">' in shown.text and 'value="likes" checked' in shown.text


def test_save_keeps_opt_outs_of_topics_not_on_the_page(client, sub):
    subscribers.update(sub, {"category_opt_outs": ["hidden-topic"]})
    page = client.get(pref_path(sub))
    form = save_form(csrf_from(page), shown_category=["likes"], category=["likes"])
    assert client.post(pref_path(sub), data=form, follow_redirects=False).status_code == 303
    assert row(sub)["category_opt_outs"] == ["hidden-topic"]


def test_ticking_a_topic_again_removes_the_opt_out(client, sub):
    subscribers.update(sub, {"category_opt_outs": ["likes"]})
    page = client.get(pref_path(sub))
    form = save_form(csrf_from(page), shown_category=["likes"], category=["likes"])
    client.post(pref_path(sub), data=form, follow_redirects=False)
    assert row(sub)["category_opt_outs"] == []


def test_cadence_change_cancels_pending_run_of_old_cadence(client, sub):
    run_id = factories.digest_run(sub, cadence="daily")
    page = client.get(pref_path(sub))
    client.post(pref_path(sub), data=save_form(csrf_from(page), digest_cadence="weekly"), follow_redirects=False)
    assert db.query("SELECT status FROM digest_runs WHERE id = %s", (run_id,))[0][0] == "cancelled"


@pytest.mark.parametrize("case", ["no_cookie", "no_field", "wrong_token", "other_subscribers_token"])
def test_post_without_valid_csrf_is_403_and_saves_nothing(client, sub, case):
    other = factories.subscriber("u2")
    page = client.get(pref_path(sub))
    token = csrf_from(page)
    form = save_form(token, digest_cadence="off")
    if case == "no_cookie":
        client.cookies.clear()
    elif case == "no_field":
        del form["csrf_token"]
    elif case == "wrong_token":
        form["csrf_token"] = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    elif case == "other_subscribers_token":
        form["csrf_token"] = csrf_from(client.get(pref_path(other)))
    before = row(sub)
    r = client.post(pref_path(sub), data=form, follow_redirects=False)
    assert r.status_code == 403
    assert "nothing was saved" in r.text
    assert row(sub) == before


def test_invalid_values_show_the_page_again_with_errors_and_save_nothing(client, sub):
    page = client.get(pref_path(sub))
    before = row(sub)
    form = save_form(
        csrf_from(page),
        digest_cadence="fortnightly",
        digest_hour="99",
        digest_weekday="funday",
        timezone="Mars/Olympus_Mons",
        pause_days="-3",
    )
    r = client.post(pref_path(sub), data=form, follow_redirects=False)
    assert r.status_code == 422
    html = r.text
    assert 'role="alert"' in html and "Nothing was saved" in html
    for field in ("digest_cadence", "digest_hour", "digest_weekday", "timezone", "pause_days"):
        assert f'id="{field}-error"' in html, field
    assert 'value="Mars/Olympus_Mons"' in html  # the submitted value comes back for correcting
    assert 'aria-invalid="true"' in html
    assert row(sub) == before
    # the re-rendered form still works: a corrected resubmit saves
    fixed = save_form(csrf_from(r), timezone="Asia/Tokyo")
    assert client.post(pref_path(sub), data=fixed, follow_redirects=False).status_code == 303
    assert row(sub)["timezone"] == "Asia/Tokyo"


@pytest.mark.parametrize(
    "typed,stored",
    [("europe/lisbon", "Europe/Lisbon"), ("America/New York", "America/New_York"), (" Asia/Tokyo ", "Asia/Tokyo")],
)
def test_timezone_typed_loosely_is_stored_canonically(client, sub, typed, stored):
    page = client.get(pref_path(sub))
    r = client.post(pref_path(sub), data=save_form(csrf_from(page), timezone=typed), follow_redirects=False)
    assert r.status_code == 303
    assert row(sub)["timezone"] == stored


def test_one_bad_field_saves_none_of_the_good_ones(client, sub):
    page = client.get(pref_path(sub))
    form = save_form(csrf_from(page), digest_cadence="weekly", timezone="Not/AZone")
    assert client.post(pref_path(sub), data=form).status_code == 422
    assert row(sub)["digest_cadence"] == "daily"


def test_pause_for_n_days_then_resume(client, sub):
    page = client.get(pref_path(sub))
    r = client.post(pref_path(sub), data=save_form(csrf_from(page), pause_days="14"), follow_redirects=False)
    assert r.status_code == 303
    until = row(sub)["paused_until"]
    expected = datetime.now(UTC) + timedelta(days=14)
    assert abs((until - expected).total_seconds()) < 3600
    page = client.get(pref_path(sub))
    assert "Emails are paused until" in page.text
    r = client.post(pref_path(sub), data={"csrf_token": csrf_from(page), "action": "resume"}, follow_redirects=False)
    assert r.headers["location"].endswith("?notice=resumed")
    assert row(sub)["paused_until"] is None


def test_unsubscribe_from_everything_and_resubscribe_on_preferences(client, sub):
    page = client.get(pref_path(sub))
    r = client.post(
        pref_path(sub), data={"csrf_token": csrf_from(page), "action": "unsubscribe"}, follow_redirects=False
    )
    assert r.status_code == 303
    assert row(sub)["unsubscribed_at"] is not None
    page = client.get(r.headers["location"])
    assert "You are unsubscribed" in page.text and "Resubscribe" in page.text
    client.post(pref_path(sub), data={"csrf_token": csrf_from(page), "action": "resubscribe"})
    assert row(sub)["unsubscribed_at"] is None


def test_unknown_action_is_rejected(client, sub):
    page = client.get(pref_path(sub))
    before = row(sub)
    r = client.post(pref_path(sub), data={"csrf_token": csrf_from(page), "action": "drop_table"})
    assert r.status_code == 400 and row(sub) == before


def test_oversized_form_is_refused(client, sub):
    page = client.get(pref_path(sub))
    form = save_form(csrf_from(page), shown_category=["x" * 1000] * 100)
    r = client.post(pref_path(sub), data=form)
    assert r.status_code == 413


# ---------------------------------------------------------------- hostile input


def test_names_and_category_labels_are_escaped(client):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    sub = factories.subscriber("evil", name=evil)
    factories.category_events("evil", evil, '"><svg onload=alert(2)>')
    html = client.get(pref_path(sub)).text
    assert "<script>alert" not in html and "<img src=x" not in html and "<svg" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert 'value="&#34;&gt;&lt;svg onload=alert(2)&gt;"' in html
    # and a hostile topic round-trips as data, not markup
    page = client.get(pref_path(sub))
    form = save_form(csrf_from(page), shown_category=[evil, '"><svg onload=alert(2)>'], category=[evil])
    assert client.post(pref_path(sub), data=form, follow_redirects=False).status_code == 303
    assert row(sub)["category_opt_outs"] == ['"><svg onload=alert(2)>']


def test_hostile_scope_category_is_escaped_on_unsubscribe_page(client, sub):
    html = client.get(unsub_path(sub, scope="category:<b>bold</b>")).text
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html


# ---------------------------------------------------------------- tokens: forgery, enumeration, revocation


def _tamper(token: str) -> str:
    body, mac = token.split(".")
    payload = tokens._unb64(body).decode().replace(":1:", ":2:", 1)  # point at subscriber 2
    return f"{tokens._b64(payload.encode())}.{mac}"


@pytest.mark.parametrize("purpose,prefix", [("preferences", "/preferences/"), ("unsubscribe", "/u/")])
def test_forged_or_revoked_tokens_get_404_and_change_nothing(client, settings, purpose, prefix):
    victim = factories.subscriber("u1")  # id 1
    neighbour = factories.subscriber("u2")  # id 2: the id an enumerator would try next
    settings(secret_key="someone-elses-secret")
    foreign = tokens.make(purpose, victim, 1)
    settings(secret_key="the-real-secret")
    good = tokens.make(purpose, victim, 1)
    other_purpose = tokens.make("unsubscribe" if purpose == "preferences" else "preferences", victim, 1)
    neighbour_old = tokens.make(purpose, neighbour, 1)
    db.query("UPDATE subscribers SET token_version = 2 WHERE id = %s", (neighbour,))  # revoke
    bad_tokens = {
        "garbage": "not-a-token",
        "tampered id (enumeration)": _tamper(good),
        "truncated mac": good[:-3],
        "empty mac": good.split(".")[0] + ".",
        "signed with another secret": foreign,
        "token for the other page": other_purpose,
        "bumped token_version": neighbour_old,
        "unknown subscriber": tokens.make(purpose, 999, 1),
        "huge": "A" * 5000 + "." + "B" * 20,
    }
    for name, token in bad_tokens.items():
        r = client.get(prefix + token)
        assert r.status_code == 404, name
        assert "Link not found" in r.text and "<html" in r.text, name
        r = client.post(prefix + token, data={"List-Unsubscribe": "One-Click"})
        assert r.status_code == 404, name
    assert db.query("SELECT count(*) FROM subscribers WHERE unsubscribed_at IS NOT NULL")[0][0] == 0
    # the genuine link still works under the current key
    assert client.get(prefix + good).status_code == 200


def test_new_token_version_works_after_revocation(client, sub):
    db.query("UPDATE subscribers SET token_version = 5 WHERE id = %s", (sub,))
    assert client.get("/preferences/" + tokens.make("preferences", sub, 1)).status_code == 404
    assert client.get(tokens.preferences_url(sub, 5).split("8000", 1)[1]).status_code == 200


def test_tokens_signed_with_a_rotated_out_key_still_work(client, settings, sub):
    settings(secret_key="old-key")
    old = tokens.make("unsubscribe", sub, 1)
    settings(secret_key="new-key", secret_key_fallbacks=("old-key",))
    assert client.get("/u/" + old).status_code == 200
    settings(secret_key="new-key", secret_key_fallbacks=())
    assert client.get("/u/" + old).status_code == 404


def test_tokens_for_neighbouring_ids_share_no_guessable_structure():
    a, b = tokens.make("unsubscribe", 1, 1), tokens.make("unsubscribe", 2, 1)
    mac_a, mac_b = a.split(".")[1], b.split(".")[1]
    assert len(mac_a) >= 22  # >= 128-bit MAC
    assert sum(x == y for x, y in zip(mac_a, mac_b)) < len(mac_a) // 2


# ---------------------------------------------------------------- unsubscribe page and one-click


def test_get_never_unsubscribes(client, sub):
    for _ in range(3):
        r = client.get(unsub_path(sub))
        assert r.status_code == 200
        assert 'name="action" value="unsubscribe"' in r.text
    assert client.head(unsub_path(sub)).status_code == 200
    assert row(sub)["unsubscribed_at"] is None


def _fresh_client():
    from app.web import app

    return TestClient(app)


def test_one_click_urlencoded_no_cookie_no_redirect(sub):
    with _fresh_client() as mail_client:
        r = mail_client.post(
            unsub_path(sub),
            content=b"List-Unsubscribe=One-Click",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
    assert r.status_code == 200
    assert "location" not in r.headers and "set-cookie" not in r.headers
    assert "Unsubscribed" in r.text
    assert row(sub)["unsubscribed_at"] is not None


def test_one_click_multipart(sub):
    with _fresh_client() as mail_client:
        r = mail_client.post(unsub_path(sub), files={"List-Unsubscribe": (None, "One-Click")}, follow_redirects=False)
    assert r.request.headers["content-type"].startswith("multipart/form-data")
    assert r.status_code == 200 and "location" not in r.headers
    assert row(sub)["unsubscribed_at"] is not None


def test_one_click_without_content_type_still_unsubscribes(sub):
    with _fresh_client() as mail_client:
        r = mail_client.post(unsub_path(sub), content=b"List-Unsubscribe=One-Click")
    assert r.status_code == 200 and row(sub)["unsubscribed_at"] is not None


def test_repeated_one_click_keeps_the_first_time(client, sub):
    client.post(unsub_path(sub), data={"List-Unsubscribe": "One-Click"})
    first = row(sub)["unsubscribed_at"]
    client.post(unsub_path(sub), data={"List-Unsubscribe": "One-Click"})
    assert row(sub)["unsubscribed_at"] == first


def test_unsubscribe_cancels_pending_runs(client, sub):
    pending = factories.digest_run(sub, period=date.today())
    sent = factories.digest_run(sub, status="sent", period=date.today() - timedelta(days=1))
    client.post(unsub_path(sub), data={"List-Unsubscribe": "One-Click"})
    statuses = dict(db.query("SELECT id, status FROM digest_runs"))
    assert statuses == {pending: "cancelled", sent: "sent"}


def test_confirmation_button_then_resubscribe(client, sub):
    page = client.get(unsub_path(sub))
    r = client.post(unsub_path(sub), data={"action": "unsubscribe"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == unsub_path(sub) + "?notice=unsubscribed"
    assert row(sub)["unsubscribed_at"] is not None
    page = client.get(r.headers["location"])
    assert "You are unsubscribed" in page.text and 'value="resubscribe"' in page.text
    # resubscribe is CSRF-protected
    assert client.post(unsub_path(sub), data={"action": "resubscribe"}).status_code == 403
    assert row(sub)["unsubscribed_at"] is not None
    r = client.post(
        unsub_path(sub), data={"action": "resubscribe", "csrf_token": csrf_from(page)}, follow_redirects=False
    )
    assert r.status_code == 303
    assert row(sub)["unsubscribed_at"] is None


def test_category_scoped_token_unsubscribes_from_that_topic_only(client, sub):
    path = unsub_path(sub, scope="category:likes")
    assert "about “likes”" in client.get(path).text
    client.post(path, data={"List-Unsubscribe": "One-Click"})
    saved = row(sub)
    assert saved["category_opt_outs"] == ["likes"] and saved["unsubscribed_at"] is None
    page = client.get(path)
    client.post(path, data={"action": "resubscribe", "csrf_token": csrf_from(page)})
    assert row(sub)["category_opt_outs"] == []


def test_newsletter_scoped_token_unsubscribes_from_everything(client, sub):
    client.post(unsub_path(sub, scope="newsletter:7"), data={"List-Unsubscribe": "One-Click"})
    assert row(sub)["unsubscribed_at"] is not None


def test_urls_built_for_mail_resolve_to_the_pages(client, settings, sub):
    settings(base_url="https://notify.example")
    for url in (tokens.unsubscribe_url(sub, 1), tokens.preferences_url(sub, 1)):
        assert url.startswith("https://notify.example/")
        assert client.get(url.removeprefix("https://notify.example")).status_code == 200
