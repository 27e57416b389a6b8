"""Mails and pages in Debian's headless Chromium at 1280 and 390 px: a digest (its hosted copy, the
same HTML the mail carries), a newsletter in the layout, the digest and newsletter as delivered
(sent through the service to the file provider; the text/html part of the stored message), the
preference page after saving, and a stream unsubscribe page. Screenshots land in test-artifacts/
(<name>-1280.png, <name>-390.png); at 390 px nothing may scroll sideways."""

from __future__ import annotations

import email
import email.policy
import os
import re
from datetime import UTC, datetime, timedelta

import pytest

from app.newsletter import template
from app.platform import mail_layout, providers, tokens
from app.subscribers import categories, streams
from digest import send as digest_send
from tests import factories
from tests.browser.test_pages import CHROMIUM, browser, live_server, shot, sync_playwright  # noqa: F401
from tests.newsletter_support import drain, start

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="python package 'playwright' is not installed"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} not found"),
]

WIDTHS = (1280, 390)
OVERFLOW_JS = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def at_each_width(browser, name: str, load) -> list[str]:
    """load(page) at each width; asserts no sideways scroll at 390 px; returns each page's text."""
    texts = []
    for width in WIDTHS:
        mobile = width < 600
        context = browser.new_context(
            viewport={"width": width, "height": 900},
            is_mobile=mobile,
            has_touch=mobile,
            device_scale_factor=2 if mobile else 1,
            locale="en-US",
        )
        try:
            page = context.new_page()
            load(page)
            if mobile:
                assert page.evaluate(OVERFLOW_JS) <= 0, f"{name} scrolls sideways at {width} px"
            texts.append(page.locator("body").inner_text())
            shot(page, f"{name}-{width}")
        finally:
            context.close()
    return texts


POSTAL_ADDRESS = "Demo Ltd, 1 Example Street, Lisbon"
WIDE_BODY = (
    "<h1>{{greeting}} here is what's new</h1>"
    "<p>We shipped streams: stop newsletters and keep your digest, or the other way round.</p>"
    '<p><img src="data:image/svg+xml;utf8,<svg xmlns=%27http://www.w3.org/2000/svg%27 width=%27900%27 '
    'height=%27300%27><rect width=%27900%27 height=%27300%27 fill=%27%23ddd%27/></svg>" width="900" '
    'height="300" alt="A wide picture"></p>'
    '<p>Read more: <a href="https://example.test/a/very/long/link/that/has/no/spaces/at/all/'
    'and/goes/on/and/on/for/ever/and/ever">https://example.test/a/very/long/link/that/has/no/spaces/'
    "at/all/and/goes/on/and/on/for/ever/and/ever</a></p>"
)


@pytest.fixture
def mail_out(settings, tmp_path):
    """The service sends to the file provider (MAIL_PROVIDER=file, MAIL_FILE_DIR=tmp_path), with a postal address."""
    settings(mail_provider="file", mail_file_dir=str(tmp_path), mail_postal_address=POSTAL_ADDRESS)
    yield tmp_path
    providers.close_all()


def delivered_html(directory) -> str:
    """The text/html part of the one message the file provider stored."""
    [path] = directory.glob("*.eml")
    return email.message_from_bytes(path.read_bytes(), policy=email.policy.default).get_body(("html",)).get_content()


def show_delivered(page, html: str) -> None:
    page.set_content(html)
    assert page.get_by_role("link", name="Unsubscribe").first.is_visible()
    assert page.get_by_text(POSTAL_ADDRESS).first.is_visible()


def test_delivered_digest_at_1280_and_390(mail_out, browser):
    sid = factories.subscriber("browser-delivered", name="Ana Lima", timezone="Europe/Lisbon")
    categories.upsert("likes", categories.validate({"label": "Likes", "verb": "liked"})[0])
    for post, title, n in (
        ("p1", "Launch notes", 4),
        ("p2", "A rather long title about the roadmap for the third quarter and everything that comes with it", 2),
    ):
        factories.events(
            "browser-delivered",
            n,
            category="likes",
            entity_id=post,
            payload={
                "entity_title": title,
                "entity_url": f"https://example.test/posts/{post}",
                "actor_avatar_url": "https://example.test/avatars/a.png",
            },
        )
    assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
    html = delivered_html(mail_out)
    for text in at_each_width(browser, "digest-delivered", lambda page: show_delivered(page, html)):
        assert "Launch notes" in text and "Hi Ana" in text and POSTAL_ADDRESS in text


def test_delivered_newsletter_at_1280_and_390(mail_out, browser):
    factories.subscriber("browser-news", name="Ana Lima")
    newsletter_id = factories.newsletter("News for {{name}}", WIDE_BODY)
    start(newsletter_id, {"kind": "user_ids", "user_ids": ["browser-news"]})
    drain(newsletter_id, providers.get_provider())
    html = delivered_html(mail_out)
    for text in at_each_width(browser, "newsletter-delivered", lambda page: show_delivered(page, html)):
        assert "Hi Ana, here is what's new" in text and POSTAL_ADDRESS in text


def test_digest_at_1280_and_390(live_server, browser):
    sid = factories.subscriber("browser-digest", name="Ana Lima", timezone="Europe/Lisbon")
    sent_at = datetime.now(UTC) - timedelta(minutes=5)
    run_id = factories.digest_run(sid, status="sent", completed_at=sent_at)
    posts = [
        ("p1", "Launch notes", 6),
        ("p2", "A rather long title about the roadmap for the third quarter and everything that comes with it", 3),
        ("p3", "Design review: onboarding", 2),
    ]
    for post, title, n in posts:
        factories.events(
            "browser-digest",
            n,
            category="likes",
            entity_id=post,
            run_id=run_id,
            when=sent_at - timedelta(hours=2),
            payload={
                "entity_title": title,
                "entity_url": f"https://example.test/posts/{post}?"
                "utm_source=digest&a-very-long-query-string-that-must-wrap=1234567890abcdef",
            },
        )
    factories.events(
        "browser-digest",
        2,
        category="comments",
        entity_id="p1",
        run_id=run_id,
        when=sent_at - timedelta(minutes=30),
        payload={"text": "Looks good"},
    )
    # the keys the preference test's events use too: the server caches the registry for a while
    for key, label, verb in (("likes", "Likes", "liked"), ("comments", "Comments", "commented on")):
        categories.upsert(key, categories.validate({"label": label, "verb": verb})[0])
    url = live_server + "/v/" + tokens.make("view", sid, 1, f"run:{run_id}")

    def load(page):
        response = page.goto(url)
        assert response.status == 200

    texts = at_each_width(browser, "digest", load)
    for text in texts:
        assert "Launch notes" in text and "Hi Ana, here is your daily digest" in text
        assert "Notify" in text and "This digest was sent on" in text


def test_newsletter_in_the_layout_at_1280_and_390(browser):
    brand = mail_layout.Brand("Acme Weekly", "", "#b3261e", "#f6f1ec")
    compiled = template.Compiled(
        "News{{#name}} for {{name}}{{/name}}", WIDE_BODY, None, "Acme Ltd, 1 Main St, Springfield", brand
    )
    rendered = compiled.render(
        {
            "name": "",
            "email": "a@example.test",
            "user_id": "u1",
            "unsubscribe_url": "https://notify.example/u/TOKEN",
            "preferences_url": "https://notify.example/preferences/TOKEN",
        }
    )
    texts = at_each_width(browser, "newsletter", lambda page: page.set_content(rendered.html))
    for text in texts:
        assert "Acme Weekly" in text and "Hi, here is what's new" in text and "Unsubscribe" in text


def test_preference_page_after_saving_at_1280_and_390(live_server, browser):
    sid = factories.subscriber("browser-prefs", name="Ana Lima")
    factories.category_events("browser-prefs", "likes", "comments", "mentions")
    url = live_server + "/preferences/" + tokens.make("preferences", sid, 1)
    saved = []

    def load(page):
        page.goto(url)
        page.get_by_role("radio", name="Weekly digest").check()
        page.get_by_label("Time of day").select_option("18")
        page.get_by_label("Weekday").select_option("4")
        page.get_by_label("Time zone", exact=True).fill("Europe/Lisbon")
        page.get_by_label("Send me newsletters").uncheck()
        page.get_by_role("button", name="Save preferences").click()
        page.wait_for_url("**?notice=saved")
        saved.append(page.get_by_role("status").inner_text())

    at_each_width(browser, "preferences-saved", load)
    for notice in saved:
        assert "Your preferences are saved" in notice
        assert re.search(r"Your next digest: Friday \d+ \w+, 18:\d\d Europe/Lisbon\.", notice), notice  # + stagger
    assert not factories.db.query("SELECT newsletters_unsubscribed_at IS NULL FROM subscribers WHERE id = %s", (sid,))[
        0
    ][0]


def test_stream_unsubscribe_page_at_1280_and_390(live_server, browser):
    sid = factories.subscriber("browser-unsub")
    url = live_server + "/u/" + tokens.make("unsubscribe", sid, 1, streams.DIGESTS)

    def load(page):
        page.goto(url)
        assert page.get_by_role("button", name="Unsubscribe from digest emails").is_visible()
        assert page.get_by_role("button", name="Unsubscribe from everything").is_visible()

    at_each_width(browser, "unsubscribe-digests", load)


@pytest.fixture
def viewer(mail_out):
    """The development mail viewer (scripts/dev/mailviewer.py) under uvicorn, reading mail_out."""
    import socket
    import threading
    import time

    import uvicorn

    from scripts.dev import mailviewer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(mailviewer.viewer_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("mail viewer did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_the_mail_viewer_shows_the_whole_mail_at_1280_and_390(mail_out, viewer, browser):
    """Issue 22.8: the frame is as tall as the mail, so its footer is on the page, not hidden in a
    scroll box; nothing scrolls sideways at 390 px."""
    sid = factories.subscriber("browser-viewer", name="Ana Lima")
    for i in range(12):  # a long digest: taller than any window
        factories.events("browser-viewer", 2, entity_id=f"p{i}", payload={"entity_title": f"Post number {i}"})
    assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
    [path] = mail_out.glob("*.eml")

    def load(page):
        page.goto(f"{viewer}/dev/mail/{path.stem}")
        page.wait_for_load_state("load")
        frame = page.frame_locator("iframe.mail")
        assert frame.get_by_text(POSTAL_ADDRESS).is_visible()
        inner, outer = page.evaluate(
            "() => { const f = document.querySelector('iframe.mail');"
            " return [f.contentDocument.documentElement.scrollHeight, f.clientHeight]; }"
        )
        assert inner <= outer + 1, "the frame cuts the mail off"
        assert outer > 900  # taller than the window: the page scrolls, the frame does not

    for text in at_each_width(browser, "mail-viewer", load):
        assert "Plain text" in text


RIGHT_ALIGNED_JS = """(selector) => {
    const el = document.querySelector(selector), range = document.createRange();
    range.selectNodeContents(el);
    const text = range.getBoundingClientRect(), box = el.getBoundingClientRect();
    return {dir: getComputedStyle(el).direction, gapRight: box.right - text.right, gapLeft: text.left - box.left};
}"""


def _reads_right_to_left(page, selector: str) -> None:
    """The element runs right to left and its text starts at its right edge."""
    found = page.evaluate(RIGHT_ALIGNED_JS, selector)
    assert found["dir"] == "rtl" and found["gapRight"] < 2 and found["gapLeft"] > found["gapRight"], found


def test_an_arabic_digest_reads_right_to_left_at_1280_and_390(mail_out, browser):
    """Issue 39 item 7: lang and dir="rtl" on the mail, the layout mirrored, no sideways scrolling."""
    sid = factories.subscriber("browser-ar", name="أمل", timezone="Asia/Riyadh", locale="ar")
    categories.upsert("likes", categories.validate({"label": "Likes", "verb": "liked"})[0])
    factories.events("browser-ar", 3, category="likes", entity_id="p1", payload={"entity_title": "ملاحظات الإطلاق"})
    assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
    html = delivered_html(mail_out)

    def load(page):
        page.set_content(html)
        assert page.evaluate("document.documentElement.lang + ' ' + document.documentElement.dir") == "ar rtl"
        _reads_right_to_left(page, "h1")
        assert page.get_by_role("link", name="إلغاء الاشتراك").first.is_visible()

    for text in at_each_width(browser, "ar-digest", load):
        assert "ملاحظات الإطلاق" in text and "إليك خلاصتك اليومية" in text


def test_an_arabic_preference_page_reads_right_to_left_at_1280_and_390(live_server, browser):
    sid = factories.subscriber("browser-ar-prefs", name="أمل", locale="ar")
    factories.category_events("browser-ar-prefs", "likes", "comments")
    url = live_server + "/preferences/" + tokens.make("preferences", sid, 1)

    def load(page):
        page.goto(url)
        assert page.evaluate("document.documentElement.lang + ' ' + document.documentElement.dir") == "ar rtl"
        _reads_right_to_left(page, "h1")
        assert page.get_by_role("button", name="حفظ التفضيلات").is_visible()

    for text in at_each_width(browser, "ar-preferences", load):
        assert "تفضيلات البريد" in text
