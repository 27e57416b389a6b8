"""The subscriber pages in a real browser: Debian's headless Chromium driven by Playwright's python
package (no browser download), against the real app served by uvicorn on 127.0.0.1.

Screenshots of every page land in test-artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.platform import config, db, tokens
from tests import factories

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ROOT = Path(__file__).resolve().parents[2]
USER_ID = "browser-user"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - only when dev extras are not installed
    sync_playwright = None

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        sync_playwright is None, reason="python package 'playwright' is not installed (pip install -e '.[dev]')"
    ),
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} not found: `make browser` (as root) apt-get installs Debian's chromium",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(url: str, proc: subprocess.Popen, log_path: Path, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"uvicorn did not answer {url} within {limit_s}s:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def live_server():
    """The real ASGI app in its own uvicorn process, on the test database."""
    ARTIFACTS.mkdir(exist_ok=True)
    settings = config.get()
    log_path = ARTIFACTS / "browser-uvicorn.log"
    for attempt in range(3):  # a free port can be taken between probe and bind: try another
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "APP_ENV": "test",
            "DATABASE_URL": settings.database_url,
            "REDIS_URL": settings.redis_url,
            "SECRET_KEY": settings.secret_key,
            "BASE_URL": base,
        }
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.web:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_until_serving(f"{base}/static/pages.css", proc, log_path)
            break
        except RuntimeError:
            proc.kill()
            proc.wait()
            if attempt == 2:
                raise
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1000, "height": 900}, locale="en-US")
    pg = context.new_page()
    dialogs = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.dialogs = dialogs  # any alert() would mean injected script ran
    yield pg
    context.close()


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    return path


def stored(subscriber_id: int) -> dict:
    cols = ("digest_cadence", "digest_hour", "timezone", "category_opt_outs", "unsubscribed_at")
    return dict(zip(cols, db.query(f"SELECT {', '.join(cols)} FROM subscribers WHERE id = %s", (subscriber_id,))[0]))


def test_preference_centre_change_cadence_and_topic(live_server, page):
    sub = factories.subscriber(USER_ID)
    factories.category_events(USER_ID, "likes", "comments", "mentions")
    page.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
    assert page.title().startswith("Email preferences")
    shot(page, "preferences")

    page.get_by_role("radio", name="Weekly digest").check()
    page.get_by_label("Time of day").select_option("18")
    page.get_by_label("Time zone", exact=True).fill("Europe/Berlin")
    page.get_by_label("Comments", exact=True).uncheck()
    page.get_by_role("button", name="Save preferences").click()
    page.wait_for_url("**?notice=saved")

    assert "Your preferences are saved" in page.get_by_role("status").inner_text()
    assert page.get_by_role("radio", name="Weekly digest").is_checked()
    assert (
        not page.get_by_label("Comments", exact=True).is_checked()
        and page.get_by_label("Likes", exact=True).is_checked()
    )
    shot(page, "preferences-saved")
    row = stored(sub)
    assert (row["digest_cadence"], row["digest_hour"], row["timezone"]) == ("weekly", 18, "Europe/Berlin")
    assert row["category_opt_outs"] == ["comments"]


UNLABELLED_CONTROLS_JS = """
() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !(el.tagName === 'BUTTON' && el.textContent.trim()))
  .map(el => el.outerHTML)
"""


def test_every_control_has_an_accessible_name(live_server, page):
    sub = factories.subscriber(USER_ID)
    factories.category_events(USER_ID, "likes")
    db.query("UPDATE subscribers SET paused_until = now() + interval '2 days' WHERE id = %s", (sub,))
    page.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
    assert page.evaluate(UNLABELLED_CONTROLS_JS) == []
    assert page.locator("fieldset:not(:has(> legend))").count() == 0
    assert "Emails are paused until" in page.locator("main").inner_text()
    shot(page, "preferences-paused")
    page.get_by_role("button", name="Resume emails now").click()
    page.wait_for_url("**?notice=resumed")
    assert db.query("SELECT paused_until FROM subscribers WHERE id = %s", (sub,))[0][0] is None
    page.goto(live_server + "/u/" + tokens.make("unsubscribe", sub, 1))
    assert page.evaluate(UNLABELLED_CONTROLS_JS) == []


def test_preference_centre_by_keyboard_only(live_server, page):
    sub = factories.subscriber(USER_ID)
    page.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
    page.focus("#cadence-daily")
    page.keyboard.press("ArrowDown")  # radios move with arrow keys: daily -> weekly
    page.focus("#timezone")
    page.keyboard.press("Control+A")
    page.keyboard.type("Asia/Tokyo")
    page.keyboard.press("Enter")  # Enter in a text field submits with the default button
    page.wait_for_url("**?notice=saved")
    row = stored(sub)
    assert (row["digest_cadence"], row["timezone"]) == ("weekly", "Asia/Tokyo")


def test_invalid_value_shows_errors_and_saves_nothing(live_server, page):
    sub = factories.subscriber(USER_ID)
    page.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
    page.get_by_label("Time zone", exact=True).fill("Atlantis/Capital")
    page.get_by_label("Pause all emails for this many days").fill("999")
    with page.expect_navigation() as nav:
        page.get_by_role("button", name="Save preferences").click()
    assert nav.value.status == 422
    alert = page.get_by_role("alert").inner_text()
    assert "Nothing was saved" in alert and "Time zone" in alert and "Pause" in alert
    assert page.get_by_label("Time zone", exact=True).input_value() == "Atlantis/Capital"
    shot(page, "preferences-errors")
    assert stored(sub)["timezone"] == "UTC"


def test_hostile_name_and_topic_do_not_run_script(live_server, page):
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    sub = factories.subscriber("evil-user", name=evil)
    factories.category_events("evil-user", evil)
    page.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
    assert evil in page.locator("main").inner_text()  # shown as text
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    assert page.dialogs == []


def test_mobile_layout_has_no_horizontal_scroll(live_server, browser):
    sub = factories.subscriber(USER_ID)
    factories.category_events(USER_ID, "likes", "a-rather-long-topic-name-that-should-wrap-nicely-on-phones")
    context = browser.new_context(
        viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True, device_scale_factor=2
    )
    try:
        pg = context.new_page()
        pg.goto(live_server + "/preferences/" + tokens.make("preferences", sub, 1))
        overflow = pg.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0
        shot(pg, "preferences-mobile")
    finally:
        context.close()


def test_unsubscribe_confirmation_button_and_resubscribe(live_server, page):
    sub = factories.subscriber(USER_ID)
    url = live_server + "/u/" + tokens.make("unsubscribe", sub, 1)
    page.goto(url)
    shot(page, "unsubscribe-confirm")
    assert stored(sub)["unsubscribed_at"] is None  # opening the page changed nothing

    page.get_by_role("button", name="Unsubscribe").click()
    page.wait_for_url("**?notice=unsubscribed")
    assert page.get_by_role("heading", level=1).inner_text() == "You are unsubscribed"
    shot(page, "unsubscribe-done")
    assert stored(sub)["unsubscribed_at"] is not None

    page.get_by_role("button", name="Resubscribe").click()
    page.wait_for_url("**?notice=resubscribed")
    shot(page, "unsubscribe-resubscribed")
    assert stored(sub)["unsubscribed_at"] is None


def test_invalid_link_shows_404_page(live_server, page):
    response = page.goto(live_server + "/u/forged.token")
    assert response.status == 404
    assert page.get_by_role("heading", level=1).inner_text() == "Link not found"
    shot(page, "not-found")
