"""The operator dashboard in a real browser (Debian's headless Chromium through Playwright, the app
under uvicorn; the fixtures are the subscriber pages' own): sign in, look at the dashboard, remove a
suppression, sign out — at 1280 and 390 px. Screenshots land in test-artifacts/ (gitignored)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from app.platform import apikeys, db
from app.web.admin import charts
from tests import factories
from tests.browser.test_pages import (  # noqa: F401 - browser, live_server and pytestmark are used by pytest
    UNLABELLED_CONTROLS_JS,
    browser,
    live_server,
    pytestmark,
    shot,
)
from tests.web.test_admin_routes import breaker_publisher

HOSTILE = '"><img src=x onerror=alert(1)>@evil.test'
CHARTS_LOADED_JS = "() => [...document.querySelectorAll('.chart img')].map(img => img.complete && img.naturalWidth > 0)"
OVERFLOW_JS = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.fixture(scope="module", autouse=True)
def failover():
    """The app under test sends through three providers (MAIL_PROVIDERS, before live_server starts it)
    and a worker-like process has opened postmark's breaker: the dashboard shows the providers' table
    in every test of this module, at every width."""
    saved = os.environ.get("MAIL_PROVIDERS")
    os.environ["MAIL_PROVIDERS"] = "postmark,ses,mailgun"
    try:
        with breaker_publisher(postmark=3, ses=1):
            yield
    finally:
        if saved is None:
            os.environ.pop("MAIL_PROVIDERS", None)
        else:
            os.environ["MAIL_PROVIDERS"] = saved


@pytest.fixture
def mail_history(redis_client):
    """A few hours of sent mail, opens, a bounce, a newsletter half sent, and suppressions."""
    now = datetime.now(UTC)
    subs = [factories.subscriber(f"reader{i}") for i in range(6)]
    for i, sub in enumerate(subs):
        sent = now - timedelta(hours=i % 4, minutes=5)
        run = factories.digest_run(
            sub, status="sent", scheduled_for=sent - timedelta(seconds=30 + 60 * i), completed_at=sent
        )
        if i % 2 == 0:
            factories.insert(
                "email_link_history",
                kind="open",
                mail_kind="digest",
                mail_id=run,
                subscriber_id=sub,
                occurred_at=sent + timedelta(minutes=2),
            )
    nl = factories.newsletter_row(subject="Spring news", status="sending", send_requested_at=now - timedelta(hours=2))
    for i, sub in enumerate(subs):
        factories.outbox_row(
            nl, sub, status="sent" if i < 4 else "pending", sent_at=now - timedelta(hours=2) if i < 4 else None
        )
    factories.insert(
        "webhook_events",
        sg_event_id="sg-1",
        event="bounce",
        email="gone@x.test",
        payload='{"event": "bounce"}',
        received_at=now - timedelta(hours=1),
    )
    for email in ("ana@x.test", "bo@x.test", "gone@x.test", HOSTILE):
        factories.suppression(email, source="sendgrid:bounce")
    return apikeys.create("browser-admin", "admin")


def sign_in(page, base: str, key: str) -> None:
    page.goto(base + "/admin")
    page.wait_for_url("**/admin/login")
    page.get_by_label("Admin API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(base + "/admin")


def test_sign_in_dashboard_and_remove_a_suppression(live_server, browser, mail_history):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US")
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(live_server + "/admin/login")
        assert page.evaluate(UNLABELLED_CONTROLS_JS) == []
        shot(page, "admin-login-1280")
        sign_in(page, live_server, mail_history)

        assert page.get_by_role("heading", level=1).inner_text() == "Dashboard"
        page.wait_for_load_state("networkidle")
        assert page.evaluate(CHARTS_LOADED_JS) == [True] * len(charts.CHARTS)
        tiles = page.locator(".tiles").inner_text()
        assert "Digests sent\n6" in tiles and "Newsletter mails sent\n4" in tiles and "Bounces\n1" in tiles
        assert "Spring news" in page.locator("table.newsletters").inner_text()
        assert page.evaluate(UNLABELLED_CONTROLS_JS) == []
        shot(page, "admin-dashboard-1280")
        page.get_by_role("link", name="last 7 days").click()
        page.wait_for_load_state("networkidle")
        assert page.evaluate(CHARTS_LOADED_JS) == [True] * len(charts.CHARTS)
        shot(page, "admin-dashboard-7d-1280")

        page.get_by_role("link", name="Suppressions").click()
        page.get_by_label("Search addresses").fill("x.test")
        page.get_by_role("button", name="Search").click()
        page.wait_for_url("**/admin/suppressions?q=x.test")
        assert page.locator("td.address").all_inner_texts() == ["gone@x.test", "bo@x.test", "ana@x.test"]
        page.get_by_label("Search addresses").fill(HOSTILE)
        page.get_by_role("button", name="Search").click()
        assert page.locator("td.address").all_inner_texts() == [HOSTILE]  # shown as text, not markup
        page.get_by_label("Search addresses").fill("")
        page.get_by_role("button", name="Search").click()
        shot(page, "admin-suppressions-1280")

        page.get_by_role("link", name="Remove ana@x.test").click()
        assert page.get_by_role("heading", level=1).inner_text() == "Remove from the suppression list?"
        page.get_by_label("Note for the audit log").fill("re-subscribed by phone")
        shot(page, "admin-suppression-confirm-1280")
        page.get_by_role("button", name="Remove ana@x.test").click()
        page.wait_for_url("**/admin/suppressions?notice=removed")
        assert "removed from the suppression list" in page.get_by_role("status").inner_text()
        assert "ana@x.test" in page.locator("table.audit").inner_text()
        shot(page, "admin-suppression-removed-1280")
        assert db.query("SELECT count(*) FROM suppressions WHERE email = 'ana@x.test'") == [(0,)]
        assert db.query("SELECT api_key_name, target, detail->>'note' FROM admin_audit") == [
            ("browser-admin", "ana@x.test", "re-subscribed by phone")
        ]

        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url("**/admin/login")
        page.goto(live_server + "/admin")
        page.wait_for_url("**/admin/login")
        assert dialogs == []
    finally:
        context.close()


def test_phone_width_dashboard_and_suppressions(live_server, browser, mail_history):
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=2, locale="en-US"
    )
    page = context.new_page()
    try:
        sign_in(page, live_server, mail_history)
        page.wait_for_load_state("networkidle")
        assert page.evaluate(CHARTS_LOADED_JS) == [True] * len(charts.CHARTS)
        assert page.evaluate(OVERFLOW_JS) <= 0  # wide tables scroll inside their own box
        breakers = page.locator("table.providers").inner_text()
        assert "postmark" in breakers and "open" in breakers and "not used by a live worker yet" in breakers
        shot(page, "admin-dashboard-390")
        page.goto(live_server + "/admin/suppressions")
        assert page.evaluate(OVERFLOW_JS) <= 0
        shot(page, "admin-suppressions-390")
        page.goto(live_server + "/admin/newsletters")
        assert page.evaluate(OVERFLOW_JS) <= 0
        shot(page, "admin-newsletters-390")
    finally:
        context.close()


# Nothing inside the page scrolls sideways either: a table that only scrolls in its own box hides
# columns on a phone (issue 22.8). The charts' numbers table is folded away in <details>.
BOX_OVERFLOW_JS = """() => [...document.querySelectorAll('main, main table, main .table-wrap, main form, main dl')]
    .filter(e => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.tagName.toLowerCase()}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)"""


@pytest.mark.parametrize("width", [390, 1280])
def test_every_dashboard_page_fits_the_width_without_sideways_scrolling(live_server, browser, mail_history, width):
    factories.newsletter_row(subject="News for {{name}}", status="done", send_requested_at=datetime.now(UTC))
    (removable,) = db.query("SELECT id FROM suppressions WHERE email = 'bo@x.test'")[0]
    context = browser.new_context(viewport={"width": width, "height": 844}, locale="en-US")
    page = context.new_page()
    try:
        page.goto(live_server + "/admin/login")
        assert page.evaluate(OVERFLOW_JS) <= 0 and page.evaluate(BOX_OVERFLOW_JS) == []
        sign_in(page, live_server, mail_history)
        pages = ["/admin", "/admin?range=7d", "/admin/newsletters", "/admin/suppressions"]
        for path in [*pages, f"/admin/suppressions/{removable}/remove"]:
            page.goto(live_server + path)
            page.wait_for_load_state("networkidle")
            page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
            assert page.evaluate(OVERFLOW_JS) <= 0, path
            assert page.evaluate(BOX_OVERFLOW_JS) == [], path
            assert page.evaluate(UNLABELLED_CONTROLS_JS) == [], path
            name = path.strip("/").replace("/", "-").replace("?range=", "-") or "admin"
            shot(page, f"admin-fits-{name.replace(str(removable), 'id')}-{width}")
        page.goto(live_server + "/admin/newsletters")
        # the subject as a sample reader gets it, the template beside it
        subject = page.locator("table.newsletters td.subject").first
        assert subject.locator("div").inner_text().startswith("News for Ana Lima")
        assert subject.locator(".template").inner_text() == "News for {{name}}"
        # at 390 every value is still there, under its column's name; at 1280 under the table's head
        label = page.evaluate(
            "() => getComputedStyle(document.querySelector('table.newsletters tbody td.nowrap'), '::before').content"
        )
        assert label == ('"Started"' if width < 600 else "none")
    finally:
        context.close()
