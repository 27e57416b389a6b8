"""Screenshots of what a newcomer sees after `make run`: the page at `/`, the dashboard's sign-in, the
dashboard, its newsletter and suppression lists, the mail viewer with a digest and the demo
newsletter, the preference centre, the unsubscribe page and the feed demo, each at a phone's 390 px
and a desktop's 1280 px.

    make run                                   # in one terminal (the demo data and its keys)
    .venv/bin/python -m scripts.dev.screenshots --key ADMIN_KEY --label after

Run it in `make run`'s environment (the same DATABASE_URL and SECRET_KEY: the pages' links are
signed here). Files: docs/screenshots/<label>-<page>-<width>.png. Debian's chromium drives it
(`make browser`), through Playwright without a browser download.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from app.platform import config, db, tokens

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
WIDTHS = (390, 1280)
OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
DEMO_USER = "demo-ana"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--key", required=True, help="an admin API key (make run prints one)")
    p.add_argument("--label", required=True, help="before, after, … (the files' prefix)")
    p.add_argument("--base", default=None, help="the web app (default BASE_URL)")
    p.add_argument("--viewer", default="http://127.0.0.1:8025", help="the mail viewer")
    p.add_argument("--out", default=str(OUT))
    return p.parse_args(argv)


def subscriber_pages(user_id: str) -> dict[str, str]:
    """The demo subscriber's preference centre and unsubscribe page (signed here)."""
    db.init()
    row = db.query("SELECT id, token_version FROM subscribers WHERE user_id = %s", (user_id,))
    if not row:
        return {}
    sub_id, version = row[0]
    return {
        "preferences": tokens.preferences_url(sub_id, version),
        "unsubscribe": tokens.unsubscribe_url(sub_id, version),
    }


def mail_pages(page, viewer: str) -> dict[str, str]:
    """The newest digest and the newest newsletter in the viewer (told apart by their subjects)."""
    page.goto(viewer + "/dev/mail")
    links = page.eval_on_selector_all("table a", "els => els.map(a => [a.textContent, a.href])")
    found: dict[str, str] = {}
    for subject, href in links:
        kind = "mail-newsletter" if re.search(r"what's new", subject, re.I) else "mail-digest"
        found.setdefault(kind, href)
    return found


def shoot(page, path: Path, streams: bool = False) -> str:
    """The whole page into `path`; its name, and how far it scrolls sideways if it does. A page that
    `streams` (the feed demo) is never network-idle: it is shot once loaded, its feed open."""
    if streams:
        page.wait_for_selector("body[data-loaded='1']")
        page.click("#bell")
        page.wait_for_selector("#items li")
        page.wait_for_function("document.body.dataset.events >= 1")  # the stream is up
        page.frame_locator("#preview").locator("body p, body table").first.wait_for()
    else:
        page.wait_for_load_state("networkidle")
    page.screenshot(path=str(path), full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    return f"{path.name}{f'  (scrolls sideways by {overflow} px)' if overflow > 0 else ''}"


def main(argv=None) -> int:
    args = parse_args(argv)
    from playwright.sync_api import sync_playwright

    base = (args.base or config.get().base_url).rstrip("/")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        for width in WIDTHS:
            context = browser.new_context(viewport={"width": width, "height": 900}, locale="en-GB")
            page = context.new_page()
            page.goto(base + "/admin/login")
            written.append(shoot(page, out / f"{args.label}-login-{width}.png"))
            page.get_by_label("Admin API key").fill(args.key)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(base + "/admin")
            targets = {
                "home": base + "/",
                "dashboard": base + "/admin",
                "newsletters": base + "/admin/newsletters",
                "suppressions": base + "/admin/suppressions",
                **subscriber_pages(DEMO_USER),
                **mail_pages(page, args.viewer),
                "feed-demo": config.get().feed_demo_url,
            }
            for name, url in targets.items():
                page.goto(url)
                written.append(shoot(page, out / f"{args.label}-{name}-{width}.png", streams=name == "feed-demo"))
            context.close()
        browser.close()
    print("\n".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
