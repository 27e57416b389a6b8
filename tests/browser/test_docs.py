"""`/` and `/docs` in a real browser (Debian's headless Chromium through Playwright, the app under
uvicorn; the subscriber pages' fixtures): Swagger UI renders this service's OpenAPI 3.1 document
under the page's Content-Security-Policy, with every request going to the app itself (offline), and
the home page's links work. Screenshots land in test-artifacts/ (gitignored)."""

from __future__ import annotations

from urllib.parse import urlsplit

from app.web import API_TAGS
from tests.browser.test_pages import (  # noqa: F401 - browser, live_server, page and pytestmark are used by pytest
    browser,
    live_server,
    page,
    pytestmark,
    shot,
)


def test_docs_renders_the_api_from_the_app_alone(live_server, page):
    requested, problems = [], []
    page.on("request", lambda r: requested.append(r.url))
    page.on("requestfailed", lambda r: problems.append(("failed", r.url)))
    page.on("console", lambda m: problems.append((m.type, m.text)) if m.type == "error" else None)
    page.goto(f"{live_server}/docs")
    page.wait_for_selector(".opblock")
    assert page.locator(".opblock").count() >= 10
    assert page.get_by_text("/v1/events").first.is_visible()
    assert "OAS 3.1" in page.locator(".info").inner_text()
    assert not problems, problems  # CSP violations are console errors
    hosts = {urlsplit(url).netloc for url in requested if not url.startswith("data:")}
    assert hosts == {urlsplit(live_server).netloc}, hosts
    # Grouped by purpose, the public API first: no "default" group, tracking and health last.
    groups = [name.strip().split()[0] for name in page.locator("h3.opblock-tag").all_inner_texts()]
    assert groups == [tag.name for tag in API_TAGS], groups
    shot(page, "api-docs-1280")


def test_an_operation_shows_its_example_call_and_answer(live_server, browser):
    """Issue 41: every operation shows an example request and answer; Swagger UI renders the quick
    start's events as the request and `{"accepted": 2, …}` as the answer."""
    for width in (1280, 390):
        context = browser.new_context(viewport={"width": width, "height": 1000}, locale="en-US")
        try:
            page = context.new_page()
            page.goto(f"{live_server}/docs")
            page.locator(".opblock-summary-path", has_text="/v1/events").first.click()
            block = page.locator(".opblock.is-open")
            block.locator(".body-param__example, .highlight-code").first.wait_for()
            shown = block.inner_text()
            assert "Launch notes" in shown and '"accepted": 2' in shown, shown[:2000]
            block.scroll_into_view_if_needed()
            shot(page, f"api-docs-example-{width}")
        finally:
            context.close()


def test_the_reference_reads_on_a_phone(live_server, browser):
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="en-US")
    try:
        phone = context.new_page()
        phone.goto(f"{live_server}/docs")
        phone.wait_for_selector("h3.opblock-tag")
        assert phone.locator("h3.opblock-tag").first.inner_text().strip().startswith("events")
        shot(phone, "api-docs-390")
    finally:
        context.close()


def test_home_page_links_lead_somewhere(live_server, page):
    page.goto(f"{live_server}/")
    for name in ("API reference", "OpenAPI document", "Operator dashboard"):
        link = page.get_by_role("link", name=name)
        assert link.is_visible(), name
    page.get_by_role("link", name="API reference").click()
    page.wait_for_selector(".opblock")
    page.goto(f"{live_server}/")
    page.get_by_role("link", name="Operator dashboard").click()
    assert page.url.startswith(f"{live_server}/admin")


def test_home_page_fits_a_phone(live_server, browser):
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale="en-US")
    try:
        phone = context.new_page()
        phone.goto(f"{live_server}/")
        overflow = phone.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0
        shot(phone, "home-390")
    finally:
        context.close()
