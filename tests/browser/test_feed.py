"""The feed demo page (issue 24, item 6) in Debian's headless Chromium: the bell's unseen badge,
opening the feed marks what it shows seen, a click marks an item read, a new event arrives over
the Server-Sent Events stream, and the next digest beside it loses what was seen. The API runs in
its own uvicorn process (CORS for the demo's origin only); the demo page is scripts/dev/feeddemo.py.
Screenshots land in test-artifacts/ (gitignored); docs/feed-demo.png is one of them, copied there by
hand: a test run never changes the checkout."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading

import pytest
import uvicorn

from app.platform import config, db
from tests import factories
from tests.browser.test_pages import (  # noqa: F401
    ARTIFACTS,
    CHROMIUM,
    ROOT,
    _free_port,
    _wait_until_serving,
    browser,
    sync_playwright,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="python package 'playwright' is not installed"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} not found"),
]

USER = "demo-ana"
WAIT_MS = 20_000  # bounded waits for what the page does on its own (the stream's next poll)


@pytest.fixture
def demo(monkeypatch):
    """(demo page URL): the API in its own process, the demo page served from this one."""
    ARTIFACTS.mkdir(exist_ok=True)
    settings = config.get()
    demo_port, api_port = _free_port(), _free_port()
    demo_base, api_base = f"http://127.0.0.1:{demo_port}", f"http://127.0.0.1:{api_port}"
    env = {
        **os.environ,
        "APP_ENV": "test",
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "SECRET_KEY": settings.secret_key,
        "BASE_URL": api_base,
        "FEED_ALLOWED_ORIGINS": demo_base,
        "FEED_STREAM_POLL_SECONDS": "0.2",
    }
    log_path = ARTIFACTS / "browser-feed-uvicorn.log"
    with open(log_path, "w") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.web:app", "--host", "127.0.0.1", "--port", str(api_port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    from scripts.dev import feeddemo

    monkeypatch.setenv("FEED_DEMO_API", api_base)
    server = uvicorn.Server(uvicorn.Config(feeddemo.demo_app(), host="127.0.0.1", port=demo_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait_until_serving(f"{api_base}/healthz", api, log_path)
        yield demo_base
    finally:
        server.should_exit = True
        thread.join(10)
        api.terminate()
        try:
            api.wait(timeout=10)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


def preview_text(page) -> str:
    return page.frame_locator("#preview").locator("body").inner_text()


def test_the_bell_the_feed_and_the_next_digest(demo, browser):
    sid = factories.subscriber(USER, name="Ana Lima")
    factories.events(USER, 2, entity_id="p1")
    factories.events(USER, 1, entity_id="p2", category="comment")
    context = browser.new_context(viewport={"width": 1100, "height": 800}, locale="en-US")
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{demo}/?user={USER}")
        page.wait_for_selector("body[data-loaded='1']", timeout=WAIT_MS)
        assert page.locator("#badge").inner_text() == "2"
        page.wait_for_function("document.body.dataset.events >= 1", timeout=WAIT_MS)  # the stream is up
        text = preview_text(page)
        assert "Post p1" in text and "Post p2" in text

        # opening the feed shows both items and marks them seen: the badge goes, so does the digest
        page.click("#bell")
        page.wait_for_selector("#badge[hidden]", state="attached", timeout=WAIT_MS)
        assert page.locator("#items li").count() == 2
        assert db.query("SELECT count(*) FROM feed_state WHERE subscriber_id = %s", (sid,)) == [(2,)]
        page.frame_locator("#preview").locator("text=Nothing unseen").wait_for(timeout=WAIT_MS)

        # a click marks one read
        first = page.locator("#items li").first
        assert first.get_attribute("class") == "unread"
        first.click()
        page.wait_for_selector("#items li.read", timeout=WAIT_MS)
        assert db.query("SELECT count(*) FROM feed_state WHERE read_until IS NOT NULL") == [(1,)]

        # with the feed closed, a new event raises the badge over the stream and is in the next digest
        page.click("#bell")
        factories.events(USER, 1, entity_id="p3", actor="gus", actor_name="Gus")
        page.wait_for_function("document.querySelector('#badge').textContent === '1'", timeout=WAIT_MS)
        page.frame_locator("#preview").locator("text=Post p3").wait_for(timeout=WAIT_MS)
        text = preview_text(page)
        assert "Post p1" not in text and "Post p2" not in text
        page.screenshot(path=str(ARTIFACTS / "feed-demo.png"), full_page=True)
        page.click("#bell")
        page.wait_for_function("document.querySelectorAll('#items li').length === 3", timeout=WAIT_MS)
        page.screenshot(path=str(ARTIFACTS / "feed-demo-open.png"), full_page=True)
        assert errors == []
    finally:
        context.close()


def _overlap(a: dict, b: dict) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


@pytest.mark.parametrize("width", [390, 1280])
def test_the_demo_fits_a_phone_and_a_desktop(demo, browser, width):
    """Issue 41: at 390 px the send-now button sat on the panel's heading. Every heading, button and
    panel keeps its own box, nothing scrolls sideways, and the empty states are styled like the rest."""
    factories.subscriber(USER, name="Ana Lima")
    factories.events(USER, 2, entity_id="p1")
    context = browser.new_context(viewport={"width": width, "height": 800}, locale="en-US")
    try:
        page = context.new_page()
        page.goto(f"{demo}/?user={USER}")
        page.wait_for_selector("body[data-loaded='1']", timeout=WAIT_MS)
        page.click("#bell")
        page.wait_for_selector("#items li", timeout=WAIT_MS)
        boxes = {
            sel: page.locator(sel).bounding_box()
            for sel in ("header", "#panel h2", "#items", "#next h2", "#send-now", "#preview")
        }
        for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
            assert not _overlap(box_a, box_b), (width, a, box_a, b, box_b)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), width
        page.screenshot(path=str(ARTIFACTS / f"feed-demo-{width}.png"), full_page=True)

        # nothing unseen: the preview says so in the page's own type
        page.frame_locator("#preview").locator("text=Nothing unseen").wait_for(timeout=WAIT_MS)
        font = page.evaluate("getComputedStyle(document.body).fontFamily")
        preview_font = page.frame_locator("#preview").locator("body").evaluate("b => getComputedStyle(b).fontFamily")
        assert preview_font == font, (preview_font, font)
        button = page.locator("#send-now").evaluate("b => getComputedStyle(b).backgroundColor")
        assert button not in ("rgb(239, 239, 239)", "rgb(240, 240, 240)", "rgba(0, 0, 0, 0)"), button
        page.screenshot(path=str(ARTIFACTS / f"feed-demo-empty-{width}.png"), full_page=True)
    finally:
        context.close()


def test_empty_feed_and_unknown_user_read_as_the_page_does(demo, browser):
    factories.subscriber(USER, name="Ana Lima")
    context = browser.new_context(viewport={"width": 390, "height": 800})
    try:
        page = context.new_page()
        page.goto(f"{demo}/?user={USER}")
        page.wait_for_selector("body[data-loaded='1']", timeout=WAIT_MS)
        page.click("#bell")
        assert page.locator("#items li.empty").inner_text().startswith("No notifications yet")
        page.screenshot(path=str(ARTIFACTS / "feed-demo-no-events-390.png"), full_page=True)
        font = page.evaluate("getComputedStyle(document.body).fontFamily")

        answer = page.goto(f"{demo}/?user=nobody-here")
        assert answer is not None and answer.status == 404
        assert "make run" in page.inner_text("body")
        assert page.evaluate("getComputedStyle(document.body).fontFamily") == font
    finally:
        context.close()
