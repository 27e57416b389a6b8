"""/admin over HTTP: sign-in and its cookie, sessions ending, CSRF, throttling, hostile input in the
search box, pagination bounds, and the audited suppression removal. Real Postgres and Redis."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from psycopg2.extras import Json
from starlette.testclient import TestClient

from app.cli import providers as providers_cli
from app.operations import erasure
from app.operations.audit import Operator
from app.platform import apikeys, db, metrics, tokens
from app.web.admin import charts, session, stats, suppressions, views
from tests import factories

pytestmark = pytest.mark.varies_input("sign-in, CSRF, throttling, search input of /admin: the pooled request path")

PAGES = ["/admin", "/admin?range=7d", "/admin/newsletters", "/admin/suppressions"]


@pytest.fixture(autouse=True)
def _fresh(redis_client, monkeypatch):
    """Failed-sign-in counters live in Redis (flushed by redis_client); the figures are cached per
    process; the 1 s pause after a failed sign-in is not what these tests are about."""
    monkeypatch.setattr(views, "FAILED_LOGIN_DELAY_SECONDS", 0)
    stats.cache.clear()
    yield
    stats.cache.clear()


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def sign_in(client, key: str):
    form = client.get("/admin/login")
    return client.post("/admin/login", data={"csrf_token": csrf_of(form.text), "api_key": key}, follow_redirects=False)


@pytest.fixture
def admin(client, admin_key):
    """The test client, signed in with an admin key."""
    assert sign_in(client, admin_key).status_code == 303
    return client


def set_cookie_header(response, name: str) -> dict:
    for header in response.headers.get_list("set-cookie"):
        cookie = SimpleCookie(header)
        if name in cookie:
            morsel = cookie[name]
            return {
                "value": morsel.value,
                **{k: morsel[k] for k in ("httponly", "secure", "samesite", "path", "max-age")},
            }
    raise AssertionError(f"no Set-Cookie for {name}")


# -- signed out ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES + ["/admin/suppressions/1/remove"])
def test_pages_need_a_sign_in(client, path):
    r = client.get(path, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/admin/login")


def test_charts_need_a_sign_in(client):
    assert client.get("/admin/charts/sent.svg").status_code == 401


def test_posts_signed_out_change_nothing(client):
    sid = factories.suppression("a@x.test")
    r = client.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": "x"}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/admin/login")
    assert db.query("SELECT count(*) FROM suppressions") == [(1,)]
    assert client.post("/admin/logout", follow_redirects=False).status_code == 303


# -- sign-in ---------------------------------------------------------------------------------------


def test_sign_in_sets_a_strict_http_only_cookie_and_opens_the_dashboard(client, admin_key):
    r = sign_in(client, admin_key)
    assert (r.status_code, r.headers["location"]) == (303, "/admin")
    cookie = set_cookie_header(r, session.COOKIE)
    assert cookie["httponly"] and cookie["samesite"].lower() == "strict" and cookie["path"] == "/admin"
    assert int(cookie["max-age"]) == 8 * 3600
    assert not cookie["secure"]  # APP_ENV=test over plain http only
    assert admin_key not in r.headers["set-cookie"]
    page = client.get("/admin")
    assert page.status_code == 200 and "Dashboard" in page.text and "admin-test" in page.text
    ((key_id,),) = db.query("SELECT id FROM api_keys WHERE name = 'admin-test'")
    assert db.query("SELECT api_key_id, ended_at FROM admin_sessions") == [(key_id, None)]
    assert client.get("/admin/login", follow_redirects=False).headers["location"] == "/admin"


def test_cookie_is_secure_over_https_and_always_in_production(admin_key, settings):
    from app.web import app

    with TestClient(app, base_url="https://testserver") as tls:
        assert set_cookie_header(sign_in(tls, admin_key), session.COOKIE)["secure"]
    settings(env="production")
    with TestClient(app) as plain:
        assert set_cookie_header(sign_in(plain, admin_key), session.COOKIE)["secure"]


@pytest.mark.parametrize("key", ["", "nope", "nk_" + "a" * 43, "nk_" + "x" * 400, "\x00", "nk_ünïcode-😀" * 3])
def test_a_bad_key_is_refused(client, key):
    r = sign_in(client, key)
    assert r.status_code == 401 and "not a valid admin API key" in r.text
    assert "set-cookie" not in r.headers or session.COOKIE not in r.headers["set-cookie"]
    assert client.get("/admin", follow_redirects=False).status_code == 303


def test_an_events_key_or_a_revoked_admin_key_is_refused(client, events_key):
    assert sign_in(client, events_key).status_code == 401
    revoked = apikeys.create("gone", "admin")
    apikeys.revoke("gone")
    assert sign_in(client, revoked).status_code == 401


def test_sign_in_without_csrf_token_is_refused(client, admin_key):
    client.get("/admin/login")
    r = client.post("/admin/login", data={"api_key": admin_key}, follow_redirects=False)
    assert r.status_code == 403
    forged = client.post("/admin/login", data={"api_key": admin_key, "csrf_token": "A" * 43}, follow_redirects=False)
    assert forged.status_code == 403
    assert db.query("SELECT count(*) FROM admin_sessions") == [(0,)]


def test_failed_sign_ins_are_throttled_per_client(client, admin_key, settings):
    settings(admin_login_max_failures=3)
    for _ in range(3):
        assert sign_in(client, "nk_" + "b" * 43).status_code == 401
    r = sign_in(client, admin_key)  # even the right key waits for the window to end
    assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= 900
    assert "Too many failed sign-ins" in r.text
    other = TestClient(client.app, client=("203.0.113.9", 5000))
    assert sign_in(other, admin_key).status_code == 303  # another address is not affected


def test_a_success_clears_the_failure_count(client, admin_key, settings):
    settings(admin_login_max_failures=2)
    assert sign_in(client, "nk_" + "b" * 43).status_code == 401
    assert sign_in(client, admin_key).status_code == 303
    client.cookies.clear()
    assert sign_in(client, "nk_" + "b" * 43).status_code == 401
    assert sign_in(client, admin_key).status_code == 303


# -- sessions end ----------------------------------------------------------------------------------


def test_sign_out_ends_the_session_for_a_copied_cookie_too(admin):
    copied = admin.cookies.get(session.COOKIE)
    r = admin.post("/admin/logout", data={"csrf_token": csrf_of(admin.get("/admin").text)}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/admin/login")
    admin.cookies.set(session.COOKIE, copied, path="/admin")
    assert admin.get("/admin", follow_redirects=False).status_code == 303
    assert db.query("SELECT count(*) FROM admin_sessions WHERE ended_at IS NOT NULL") == [(1,)]


def test_sign_out_without_csrf_token_is_refused(admin):
    assert admin.post("/admin/logout", follow_redirects=False).status_code == 403
    assert admin.get("/admin").status_code == 200


def test_revoking_the_key_ends_its_sessions(admin):
    apikeys.revoke("admin-test")
    assert admin.get("/admin", follow_redirects=False).status_code == 303


def test_an_expired_session_ends(admin):
    db.query("UPDATE admin_sessions SET expires_at = now() - interval '1 second'")
    assert admin.get("/admin", follow_redirects=False).status_code == 303


def test_a_tampered_or_foreign_cookie_is_signed_out(admin):
    good = admin.cookies.get(session.COOKIE)
    other_purpose = session.itsdangerous.TimestampSigner("dev-insecure-secret-key-change-me").sign("x").decode()
    stranger = TestClient(admin.app)
    assert stranger.get("/admin", headers={"cookie": f"{session.COOKIE}={good}"}).status_code == 200
    for bad in (good[:-2] + "xx", "x" * 5000, good + "%00", "%C3%A9" * 10, other_purpose, good.split(".")[0]):
        r = stranger.get("/admin", headers={"cookie": f"{session.COOKIE}={bad}"}, follow_redirects=False)
        assert r.status_code == 303, bad


# -- CSRF on every POST ----------------------------------------------------------------------------


def test_remove_without_or_with_a_wrong_csrf_token_is_403_and_changes_nothing(admin, client):
    sid = factories.suppression("a@x.test")
    sub = factories.subscriber("u1")
    subscriber_page_token = csrf_of(client.get(f"/preferences/{tokens.make('preferences', sub, 1)}").text)
    for data in (
        {},
        {"csrf_token": ""},
        {"csrf_token": "A" * 43},
        {"csrf_token": subscriber_page_token},
        {"csrf_token": "x" * 5000},
    ):
        r = admin.post(f"/admin/suppressions/{sid}/remove", data=data, follow_redirects=False)
        assert r.status_code == 403, data
    assert db.query("SELECT count(*) FROM suppressions") == [(1,)]
    assert db.query("SELECT count(*) FROM admin_audit") == [(0,)]


def test_a_token_of_another_session_is_refused(admin, admin_key):
    from app.web import app

    sid = factories.suppression("a@x.test")
    with TestClient(app) as other:
        sign_in(other, admin_key)
        foreign = csrf_of(other.get("/admin").text)
    r = admin.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": foreign}, follow_redirects=False)
    assert r.status_code == 403


# -- suppressions: add (audited) -------------------------------------------------------------------


def _add(admin, email: str, note: str = "", token: str | None = None):
    page = admin.get("/admin/suppressions").text
    data = {"csrf_token": token if token is not None else csrf_of(page), "email": email, "note": note}
    return admin.post("/admin/suppressions/add", data=data, follow_redirects=False)


def test_add_suppresses_the_canonical_address_and_audits_it(admin):
    sub = factories.subscriber("ana", email="ana@xn--bcher-kva.example")
    r = _add(admin, "Ana@Bücher.example", "phoned support, ticket 7")
    assert (r.status_code, r.headers["location"]) == (303, "/admin/suppressions?notice=added")
    assert db.query("SELECT email, reason, source FROM suppressions") == [
        ("ana@xn--bcher-kva.example", "manual", "operator admin:admin-test")
    ]
    ((key_id,),) = db.query("SELECT id FROM api_keys WHERE name = 'admin-test'")
    ((session_id,),) = db.query("SELECT id FROM admin_sessions")
    assert db.query("SELECT api_key_id, action, target, detail FROM admin_audit") == [
        (
            key_id,
            "suppression.add",
            "ana@xn--bcher-kva.example",
            {"note": "phoned support, ticket 7", "already": False, "reason": "manual", "session_id": session_id},
        )
    ]
    page = admin.get("/admin/suppressions?notice=added").text
    assert "no mail goes to it" in page and "ana@xn--bcher-kva.example" in page and "suppression.add" in page
    # May we mail them? Not from the next claim on (app/subscribers/mailable.py reads the list).
    suppressed = "SELECT EXISTS (SELECT 1 FROM suppressions x JOIN subscribers s ON x.email = s.canonical_email "
    assert db.query(suppressed + "WHERE s.id = %s)", (sub,)) == [(True,)]


def test_adding_an_address_suppressed_already_keeps_its_reason(admin):
    factories.suppression("bo@x.test", reason="bounce", source="sendgrid")
    r = _add(admin, "BO@x.test")
    assert (r.status_code, r.headers["location"]) == (303, "/admin/suppressions?notice=already-suppressed")
    assert db.query("SELECT email, reason, source FROM suppressions") == [("bo@x.test", "bounce", "sendgrid")]
    assert db.query("SELECT action, detail->>'already', detail->>'reason' FROM admin_audit") == [
        ("suppression.add", "true", "bounce")
    ]


@pytest.mark.parametrize(
    "email, note, field",
    [
        ("not an address", "", "Address"),
        ("", "", "Address"),
        ("a@b_c.example", "", "Address"),  # no IDNA domain: no canonical form
        ("a@x.test", "n" * 501, "Note"),
        ("a@x.test", "bad\x00note", "Note"),
        ("x" * 300 + "@x.test", "", "Address"),
    ],
)
def test_add_refuses_what_is_not_an_address_and_changes_nothing(admin, email, note, field):
    r = _add(admin, email, note)
    assert r.status_code == 422
    assert f"{field}: " in r.text and "Nothing changed." in r.text and 'aria-invalid="true"' in r.text
    assert db.query("SELECT count(*) FROM suppressions") == [(0,)]
    assert db.query("SELECT count(*) FROM admin_audit") == [(0,)]


def test_add_without_a_valid_csrf_token_is_403_and_changes_nothing(admin):
    for token in ("", "A" * 43):
        assert _add(admin, "a@x.test", token=token).status_code == 403
    assert db.query("SELECT count(*) FROM suppressions") == [(0,)]


# -- suppressions: remove (audited) ----------------------------------------------------------------


def test_remove_deletes_audits_and_resets_soft_bounces(admin):
    created = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    sid = factories.suppression("ana@x.test", reason="soft_bounce", source="sendgrid:deferred x3", created_at=created)
    keep = factories.suppression("bo@x.test")
    sub = factories.subscriber("ana", email="Ana@X.test")
    db.query("UPDATE subscribers SET soft_bounce_count = 3 WHERE id = %s", (sub,))
    confirm = admin.get(f"/admin/suppressions/{sid}/remove")
    assert confirm.status_code == 200 and "ana@x.test" in confirm.text and "soft_bounce" in confirm.text
    r = admin.post(
        f"/admin/suppressions/{sid}/remove",
        data={"csrf_token": csrf_of(confirm.text), "note": "asked by support, ticket 42"},
        follow_redirects=False,
    )
    assert (r.status_code, r.headers["location"]) == (303, "/admin/suppressions?notice=removed")
    assert db.query("SELECT id FROM suppressions") == [(keep,)]
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(0,)]
    ((key_id,),) = db.query("SELECT id FROM api_keys WHERE name = 'admin-test'")
    ((session_id,),) = db.query("SELECT id FROM admin_sessions")
    rows = db.query(
        "SELECT api_key_id, api_key_name, action, target, detail, at > now() - interval '1 minute' FROM admin_audit"
    )
    assert rows == [
        (
            key_id,
            "admin-test",
            "suppression.remove",
            "ana@x.test",
            {
                "suppression_id": sid,
                "reason": "soft_bounce",
                "source": "sendgrid:deferred x3",
                "suppressed_at": created.isoformat(),
                "note": "asked by support, ticket 42",
                "session_id": session_id,
            },
            True,
        )
    ]
    listing = admin.get("/admin/suppressions?notice=removed").text
    assert "removed from the suppression list" in listing and "asked by support, ticket 42" in listing


def test_removing_twice_audits_once(admin):
    sid = factories.suppression("a@x.test")
    token = csrf_of(admin.get(f"/admin/suppressions/{sid}/remove").text)
    for _ in range(2):
        r = admin.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": token}, follow_redirects=False)
        assert r.status_code == 303
    assert r.headers["location"] == "/admin/suppressions?notice=already-removed"
    assert db.query("SELECT count(*) FROM admin_audit") == [(1,)]


@pytest.mark.parametrize(
    "path",
    [
        "/admin/suppressions/0/remove",
        "/admin/suppressions/99/remove",
        "/admin/suppressions/99999999999999999999999/remove",
    ],
)
def test_remove_of_a_missing_row(admin, path):
    r = admin.get(path, follow_redirects=False)
    assert r.headers["location"] == "/admin/suppressions?notice=already-removed"
    token = csrf_of(admin.get("/admin").text)
    assert admin.post(path, data={"csrf_token": token}, follow_redirects=False).status_code == 303
    assert db.query("SELECT count(*) FROM admin_audit") == [(0,)]


def test_a_note_with_control_characters_is_refused(admin):
    sid = factories.suppression("a@x.test")
    token = csrf_of(admin.get(f"/admin/suppressions/{sid}/remove").text)
    for note in ("bad\x00note", "x" * 501):
        r = admin.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": token, "note": note})
        assert r.status_code == 422 and "Note:" in r.text
    assert db.query("SELECT count(*) FROM suppressions") == [(1,)]


# -- suppressions: search --------------------------------------------------------------------------


def test_search_is_a_literal_case_insensitive_substring(admin):
    for email in ("ana@gmail.com", "bo@gmail.com", "cy@yahoo.com", "100%_sure@x.test", "back\\slash@x.test"):
        factories.suppression(email)

    def found(q):
        r = admin.get("/admin/suppressions", params={"q": q})
        assert r.status_code == 200
        return sorted(re.findall(r'<td class="address" data-label="Address">([^<]+)</td>', r.text))

    assert found("GMAIL") == ["ana@gmail.com", "bo@gmail.com"]
    assert found("%") == ["100%_sure@x.test"] and found("_") == ["100%_sure@x.test"]
    assert found("\\") == ["back\\slash@x.test"]
    assert found("' OR 1=1 --") == [] and found("a%c") == []
    assert len(found("")) == 5


@pytest.mark.parametrize(
    "q", ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "é" * 254, "\u202e\u0041", "🙂@x", "x\u00a0y"]
)
def test_hostile_search_text_is_shown_as_text(admin, q):
    factories.suppression('"><img src=x onerror=alert(1)>@x.test')
    r = admin.get("/admin/suppressions", params={"q": q})
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "<img src=x" not in r.text


@pytest.mark.parametrize("q", ["a\x00b", "a\x1bb", "x" * 255])
def test_unusable_search_text_is_a_400_naming_the_field(admin, q):
    r = admin.get("/admin/suppressions", params={"q": q})
    assert r.status_code == 400 and "Search:" in r.text


def test_undecodable_search_bytes_are_not_a_500(admin):
    assert admin.get("/admin/suppressions?q=%ff%fe%00").status_code in (200, 400)
    assert admin.get("/admin/suppressions?q=%ff%fe").status_code == 200


# -- pagination bounds -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/admin/suppressions", "/admin/newsletters"])
@pytest.mark.parametrize("page", ["0", "-1", "abc", "1.5", " 1", "١", "", "99999999999999999999", "201", "501"])
def test_page_out_of_bounds_is_a_400_naming_the_parameter(admin, path, page):
    if page == "201" and path.endswith("newsletters"):
        page = "501"
    r = admin.get(path, params={"page": page})
    assert r.status_code == 400 and "page must be a whole number" in r.text


def test_suppression_pages(admin):
    db.query(
        "INSERT INTO suppressions (email, reason) SELECT 'p' || g || '@x.test', 'bounce' FROM generate_series(1, 60) g"
    )
    first = admin.get("/admin/suppressions")
    assert first.text.count('<td class="address" data-label="Address">') == 50 and "p60@x.test" in first.text
    assert 'rel="next"' in first.text and 'rel="prev"' not in first.text
    second = admin.get("/admin/suppressions?page=2")
    assert second.text.count('<td class="address" data-label="Address">') == 10 and "p1@x.test" in second.text
    assert 'rel="prev"' in second.text and 'rel="next"' not in second.text
    past = admin.get(f"/admin/suppressions?page={suppressions.MAX_PAGE}")
    assert past.status_code == 200 and '<td class="address" data-label="Address">' not in past.text
    searched = admin.get("/admin/suppressions?q=p1&page=1")
    assert searched.text.count('<td class="address" data-label="Address">') == 11  # p1, p10..p19


def test_newsletter_table_shows_progress(admin):
    nid = factories.newsletter_row(subject="<b>Spring</b> news", status="sending")
    for i, status in enumerate(["sent", "sent", "failed", "suppressed", "pending"]):
        factories.outbox_row(nid, factories.subscriber(f"n{i}"), status=status)
    empty = factories.newsletter_row(subject="draft one")
    page = admin.get("/admin/newsletters").text
    assert "&lt;b&gt;Spring&lt;/b&gt; news" in page and "<b>Spring" not in page
    assert '<progress max="100" value="80"' in page and "80 % of 5" in page
    assert f'<td data-label="#">{empty}</td>' in page and '<progress max="100" value="0"' in page
    assert "&lt;b&gt;Spring" in admin.get("/admin").text


# -- dashboard and charts --------------------------------------------------------------------------


def test_dashboard_shows_the_figures(admin):
    sub = factories.subscriber("u1")
    now = datetime.now(UTC)
    factories.digest_run(
        sub, status="sent", scheduled_for=now - timedelta(minutes=10), completed_at=now - timedelta(minutes=9)
    )
    page = admin.get("/admin").text
    assert re.search(r"Digests sent</dt><dd>1<", page)
    assert re.search(r"Digest lateness p50</dt><dd>60 s<", page)
    for name in ("sent", "rates", "bounces", "lateness"):
        assert f'src="/admin/charts/{name}.svg?range=24h' in page
    assert 'alt="Mails sent per hour, last 24 hours: 1 digests and 0 newsletter mails.' in page


def test_bad_range_is_a_400(admin):
    r = admin.get("/admin?range=1y")
    assert r.status_code == 400 and "range must be one of 24h, 7d" in r.text
    assert admin.get("/admin/charts/sent.svg?range=%00").status_code == 400


@pytest.mark.parametrize("name", ["sent", "rates", "bounces", "lateness"])
@pytest.mark.parametrize("range_name", ["24h", "7d"])
def test_charts_are_svg_images_without_script(admin, name, range_name):
    r = admin.get(f"/admin/charts/{name}.svg", params={"range": range_name})
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    assert b"<svg" in r.content and b"<script" not in r.content.lower()
    assert "default-src 'none'" in r.headers["content-security-policy"]


def test_unknown_chart_is_404(admin):
    assert admin.get("/admin/charts/nope.svg").status_code == 404
    assert admin.get("/admin/charts/..%2f..%2fetc.svg").status_code == 404


def test_pages_carry_the_security_headers(admin):
    for path in PAGES:
        r = admin.get(path)
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script at all


def test_audit_detail_is_json(admin):
    sid = factories.suppression("a@x.test")
    token = csrf_of(admin.get(f"/admin/suppressions/{sid}/remove").text)
    admin.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": token, "note": '"}; DROP TABLE x; --'})
    ((detail,),) = db.query("SELECT detail::text FROM admin_audit")
    assert json.loads(detail)["note"] == '"}; DROP TABLE x; --'


@pytest.mark.parametrize(
    "reason, warning",
    [
        ("bounce", "after a bounce: mailing it again"),
        ("spamreport", "after a complaint"),
        ("erased", "asked to be erased"),
        ("manual", None),
    ],
)
def test_the_confirmation_warns_by_reason(admin, reason, warning):
    sid = factories.suppression("a@x.test", reason=reason)
    text = re.sub(r"\s+", " ", admin.get(f"/admin/suppressions/{sid}/remove").text)
    assert "reach this address again from the next send on. " in text
    assert (warning in text) if warning else ("It was suppressed" not in text)
    assert " Your API key, the time and your note go into the audit log." in text


def test_a_failed_sign_in_is_answered_after_a_pause(client, monkeypatch):
    pauses = []

    async def recorded(seconds):
        pauses.append(seconds)

    monkeypatch.setattr(views, "FAILED_LOGIN_DELAY_SECONDS", 1.0)
    monkeypatch.setattr(views.asyncio, "sleep", recorded)
    assert sign_in(client, "nk_" + "b" * 43).status_code == 401
    assert pauses == [1.0]


def test_throttle_counts_in_process_while_redis_is_down(client, admin_key, settings, monkeypatch):
    import redis as redis_lib

    from app.web.admin import throttle

    down = redis_lib.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.2)
    monkeypatch.setattr(throttle, "_client", lambda: down)
    monkeypatch.setattr(throttle, "_local", {})
    settings(admin_login_max_failures=2)
    for _ in range(2):
        assert sign_in(client, "nk_" + "b" * 43).status_code == 401
    assert sign_in(client, admin_key).status_code == 429


def test_a_key_that_is_no_longer_admin_ends_its_sessions(admin):
    db.query("UPDATE api_keys SET scope = 'events' WHERE name = 'admin-test'")
    assert admin.get("/admin", follow_redirects=False).status_code == 303


def test_audit_rows_outlive_the_erasure_of_the_subscriber(admin):
    factories.subscriber("ana", email="ana@x.test")
    sid = factories.suppression("ana@x.test")
    token = csrf_of(admin.get(f"/admin/suppressions/{sid}/remove").text)
    admin.post(f"/admin/suppressions/{sid}/remove", data={"csrf_token": token})
    assert erasure.erase_subscriber("ana", Operator("admin-test"))
    assert db.query("SELECT action, target FROM admin_audit ORDER BY id") == [
        ("suppression.remove", "ana@x.test"),
        ("subscriber.erase", "a subscriber"),  # names no one
    ]


def test_the_web_process_does_not_import_matplotlib_until_a_chart_is_drawn():
    import subprocess
    import sys

    code = "import sys, app.web; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "APP_ENV": "test"},
    )
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_figure_that_times_out_is_shown_as_unavailable(admin, monkeypatch):
    monkeypatch.setattr(stats, "STATEMENT_TIMEOUT", "50ms")
    monkeypatch.setattr(stats, "_SENT_SQL", "SELECT now(), 'digest', 1 FROM pg_sleep(2)")
    page = admin.get("/admin")
    assert page.status_code == 200
    assert "Some figures are unavailable" in page.text and re.search(r"Digests sent</dt><dd>—<", page.text)
    assert admin.get("/admin/charts/sent.svg").status_code == 200
    assert admin.get("/admin/charts/rates.svg").status_code == 200


def test_an_odd_user_agent_is_stored_printable(client, admin_key):
    form = client.get("/admin/login")
    r = client.post(
        "/admin/login",
        data={"csrf_token": csrf_of(form.text), "api_key": admin_key},
        headers={"user-agent": ("Mozilla\t/5.0 " + "é" * 500).encode()},
        follow_redirects=False,
    )
    assert r.status_code == 303
    ((agent,),) = db.query("SELECT user_agent FROM admin_sessions")
    assert agent.startswith("Mozilla/5.0 ") and "\t" not in agent and len(agent) <= session.MAX_USER_AGENT_CHARS


# -- issue 22.8: counts have whole ticks, the newest suppression comes first, subjects read naturally
TICK_LABEL = re.compile(r">\s*(-?[0-9][0-9.,]*)\s*</text>")


@pytest.mark.parametrize("name", ["sent", "bounces"])
def test_count_charts_have_whole_number_ticks(admin, name):
    factories.insert(
        "webhook_events",
        sg_event_id="sg-b1",
        event="bounce",
        email="gone@x.test",
        payload='{"event": "bounce"}',
        received_at=datetime.now(UTC) - timedelta(hours=1),
    )
    sid = factories.subscriber("r1")
    factories.digest_run(sid, status="sent", completed_at=datetime.now(UTC) - timedelta(hours=1))
    svg = admin.get(f"/admin/charts/{name}.svg", params={"range": "24h"}).text
    ticks = TICK_LABEL.findall(svg)
    assert ticks and "0" in ticks  # the y axis starts at a labelled 0
    assert [t for t in ticks if "." in t] == []  # no "0.5 bounces"


def test_suppressions_newest_first_with_the_demo_history(admin):
    from scripts import demo_history

    demo_history.load()
    rows, _ = suppressions.search("", 1)
    assert len(rows) > 5
    assert [r.created_at for r in rows] == sorted((r.created_at for r in rows), reverse=True)


def test_newsletter_subjects_read_as_a_sample_reader_gets_them(admin):
    factories.newsletter_row(subject="What's new{{#name}}, {{name}}{{/name}} & more")
    factories.newsletter_row(subject="Plain subject")
    page = admin.get("/admin/newsletters").text
    assert "What&#39;s new, Ana Lima &amp; more" in page
    assert '<span class="template">What&#39;s new{{#name}}, {{name}}{{/name}} &amp; more</span>' in page
    assert page.count('<span class="template">') == 1  # a subject without tags is shown once


@pytest.mark.parametrize("env, names_the_demo_key", [("development", True), ("production", False)])
def test_the_sign_in_hint_names_the_command_a_newcomer_has(client, settings, env, names_the_demo_key):
    """The venv's console script (not `python -m app`), and in development the demo key `make run`
    already wrote to .env."""
    settings(env=env)
    page = client.get("/admin/login").text
    assert ".venv/bin/notify create-api-key NAME --scope admin" in page and "python -m app" not in page
    assert ("NOTIFY_ADMIN_KEY" in page) is names_the_demo_key


# -- mail providers: each one's circuit breaker ----------------------------------------------------

BREAKER_PUBLISHER = """
import sys
from app.platform import metrics
from app.platform.providers.failover import Breaker

metrics.setup()
breakers = []
for arg in sys.argv[1:]:
    name, failures = arg.split("=")
    breakers.append(Breaker(name, failures=3, window=600, cooldown=600))
    for _ in range(int(failures)):
        breakers[-1].failed()
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def breaker_publisher(**failures: int):
    """A process that publishes breakers as a sending worker does (failover.Breaker, the metrics
    directory of this test run): each named provider after that many definite failures (3 open it).
    It lives until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BREAKER_PUBLISHER, *(f"{name}={n}" for name, n in failures.items())],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture
def three_providers(settings):
    """MAIL_PROVIDERS=postmark,ses,mailgun; whatever this test process's own breakers published
    before (other tests of the same worker) set back to nothing."""
    settings(mail_providers=("postmark", "ses", "mailgun"))
    for name in ("postmark", "ses", "mailgun"):
        for gauge in (
            metrics.PROVIDER_BREAKER_STATE,
            metrics.PROVIDER_BREAKER_CHANGED,
            metrics.PROVIDER_BREAKER_FAILURES,
            metrics.PROVIDER_BREAKER_FAILED_AT,
        ):
            gauge.labels(name).set(0)


def breaker_rows(page: str) -> list[tuple[str, ...]]:
    """(provider, breaker, since, failures) of the dashboard's providers table, in its order."""
    section = page.split('id="providers-h"', 1)[1].split("</section>", 1)[0]
    return re.findall(
        r'<th scope="row" data-label="Provider">([a-z]+)</th>\s*'
        r'<td data-label="Breaker"><div><span class="status breaker-([a-z-]+)">[a-z-]+</span></div></td>\s*'
        r'<td data-label="Since"><div>(.*?)</div></td>\s*<td data-label="Failures">(\d+)</td>',
        section,
        re.S,
    )


def test_the_dashboard_shows_each_providers_breaker_as_the_workers_publish_it(admin, three_providers):
    with breaker_publisher(postmark=3, ses=1):
        rows = breaker_rows(admin.get("/admin").text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            providers_cli.cmd_providers(None)
    assert [(name, state, failures) for name, state, _, failures in rows] == [
        ("postmark", "open", "3"),
        ("ses", "closed", "1"),
        ("mailgun", "closed", "0"),
    ]
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert today in rows[0][2] and today in rows[1][2]  # since when: the moment it opened, the worker's start
    assert rows[2][2] == "not used by a live worker yet"
    # `notify providers` reads the same: one reader (failover.status)
    shown = json.loads(out.getvalue())["providers"]
    assert [(p["name"], p["breaker"], p["recent_failures"], p["reported"]) for p in shown] == [
        ("postmark", "open", 3, True),
        ("ses", "closed", 1, True),
        ("mailgun", "closed", 0, False),
    ]
    # the worker is gone: its breakers no longer count
    rows = breaker_rows(admin.get("/admin").text)
    assert [(name, state, since) for name, state, since, _ in rows] == [
        ("postmark", "closed", "not used by a live worker yet"),
        ("ses", "closed", "not used by a live worker yet"),
        ("mailgun", "closed", "not used by a live worker yet"),
    ]


def test_the_worst_breaker_among_live_workers_is_shown(admin, three_providers):
    with breaker_publisher(postmark=1), breaker_publisher(postmark=3):
        rows = breaker_rows(admin.get("/admin").text)
    assert rows[0][0:2] == ("postmark", "open") and rows[0][3] == "4"  # failures of both workers


def test_one_provider_has_no_breaker_to_show(admin, settings):
    settings(mail_providers=())
    with breaker_publisher(postmark=3):
        assert 'id="providers-h"' not in admin.get("/admin").text


def test_the_dashboard_shows_mails_held_and_released(admin):
    """Issue 40: the held and released counts, their chart and their column of the numbers table."""
    now = datetime.now(UTC)
    sub = factories.subscriber("held")
    factories.digest_run(sub, cadence="immediately", status="sent", held_at=now, completed_at=now)
    html = admin.get("/admin").text
    assert 'id="chart-held"' in html and charts.TITLES["held"] in html
    assert "<dt>Held (quiet hours)</dt><dd>1</dd>" in html and "<dt>Released</dt><dd>1</dd>" in html
    assert '<td data-label="Held">1</td>' in html and '<td data-label="Released">1</td>' in html
    chart = admin.get("/admin/charts/held.svg")
    assert chart.status_code == 200 and chart.headers["content-type"].startswith("image/svg+xml")


def test_a_newsletter_in_several_languages_shows_each_variant_s_counts(admin):
    """Issue 39: the newsletter table counts recipients, sent and the people who opened and clicked
    per variant (as GET /v1/newsletters/{id}); a newsletter without variants shows none."""
    stored = Json({"pt-BR": {"subject": "s", "html": "<p>x</p>"}, "ar": {"subject": "s", "html": "<p>x</p>"}})
    nid = factories.newsletter_row(subject="News", status="sending", variants=stored)
    people = {name: factories.subscriber(name) for name in ("v0", "v1", "v2", "v3")}
    for name, variant, status in (("v0", None, "sent"), ("v1", "pt-BR", "sent"), ("v2", "pt-BR", "pending")):
        factories.outbox_row(nid, people[name], status=status, variant=variant)
    factories.outbox_row(nid, people["v3"], status="failed", variant="ar")
    for who, kind, machine in (("v1", "open", False), ("v1", "click", False), ("v3", "open", True)):
        db.query(
            "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, is_machine) "
            "VALUES (%s, 'newsletter', %s, %s, %s)",
            (kind, nid, people[who], machine),
        )
    plain = factories.newsletter_row(subject="Plain", status="sending")
    factories.outbox_row(plain, people["v0"], status="sent")
    for url in ("/admin/newsletters", "/admin"):
        page = admin.get(url).text
        rows = {m.group(1): m.group(0) for m in re.finditer(r'<td data-label="#">(\d+)</td>.*?</tr>', page, re.S)}
        shown = re.findall(r'<li><span class="variant">([^<]+)</span> ([^<]+)</li>', rows[str(nid)])
        assert shown == [
            ("default", "1 recipient, 1 sent, 0 opened, 0 clicked"),
            ("ar", "1 recipient, 0 sent, 0 opened, 0 clicked"),  # a scanner's open is no person's
            ("pt-BR", "2 recipients, 1 sent, 1 opened, 1 clicked"),
        ], url
        assert "75 % of 4" in rows[str(nid)] and 'class="variants"' not in rows[str(plain)]
