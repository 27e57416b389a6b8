"""`make run` reaches nothing on the internet (issue 22.7): the demo's pictures are served by the web
app itself, its links point at reserved names that never resolve, and no page, stylesheet or mail
template loads anything from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from app.platform import config, db
from scripts import demo_data

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"""https?://[^\s"'<>)\\]+""")
# Where a URL in a template or stylesheet may point: XML namespaces are names, never fetched.
NAMESPACES = ("http://www.w3.org/",)


def local(url: str) -> bool:
    """Served by this project (BASE_URL), or a reserved name that never resolves (RFC 6761 `.test`)."""
    host = urlsplit(url).hostname or ""
    return url.startswith(config.get().base_url + "/") or host == "test" or host.endswith(".test")


def demo_urls() -> list[str]:
    """Every URL the demo data wrote: event payloads, newsletters, link rows."""
    texts = [p for (p,) in db.query("SELECT payload::text FROM digest_events")]
    texts += [f"{s} {h} {t or ''}" for s, h, t in db.query("SELECT subject, html, text FROM newsletters")]
    texts += [u for (u,) in db.query("SELECT url FROM email_links")]
    return [url for text in texts for url in URL.findall(text)]


def test_demo_data_links_and_pictures_are_all_local(client):
    demo_data.load()
    urls = demo_urls()
    assert len(urls) > 50 and any("/static/avatar-" in u for u in urls)
    assert [u for u in urls if not local(u)] == []
    for avatar in sorted({u for u in urls if "/static/avatar-" in u}):
        r = client.get(avatar.removeprefix(config.get().base_url))
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml"), avatar
        assert r.text.startswith("<svg") and "<script" not in r.text


def test_pages_stylesheets_and_mail_templates_load_nothing_from_elsewhere():
    files = [
        *(ROOT / "app/web/templates").rglob("*.html"),
        *(ROOT / "app/web/static").iterdir(),
        *(ROOT / "digest/templates").iterdir(),
        ROOT / "app/platform/mail_layout.py",
    ]
    outside = [
        (str(path.relative_to(ROOT)), url)
        for path in files
        for url in URL.findall(path.read_text())
        if not url.startswith(NAMESPACES)
    ]
    assert outside == []
