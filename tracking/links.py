"""Link rewriting at render time (digests and newsletters).

Digest and newsletter rendering call LinkRewriter(mail_kind, mail_id).rewrite(html, subscriber_id,
enabled) on each recipient's final HTML: every http(s) link of an <a>/<area> becomes a click URL
({BASE_URL}/c/<code>) and a 1x1 open pixel ({BASE_URL}/o/<code>.gif) is added before </body>.

email_links holds one row per (mail, url), never per recipient: the recipient is inside the signed
code. Rows are created with INSERT … ON CONFLICT DO NOTHING (two workers rendering the same mail
agree on one row) and the url → link id map is cached in the rewriter, so a batch of recipients
pays one DB round trip per new URL set, not per recipient.

Left alone: non-http(s) links (mailto:, tel:, #anchors), our own unsubscribe / preference links
(they must work without a redirect hop and are what RFC 8058 clients look for), and links that
are already tracking URLs. With TRACKING=off or enabled=False (per-subscriber opt-out) the HTML
is returned unchanged: clean links and no pixel.
"""
from __future__ import annotations

import hashlib
import html as html_lib
import logging
import re

import psycopg2
import psycopg2.extras

from app import config, db
from tracking import codes

log = logging.getLogger("tracking.links")

MAX_URL_LENGTH = 8192
_TAG_RE = re.compile(r"<(?:a|area)\b[^>]*>", re.IGNORECASE)
_HREF_RE = re.compile(r"""(\bhref\s*=\s*)(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
_BODY_END_RE = re.compile(r"</body\s*>", re.IGNORECASE)


def url_hash(url: str) -> bytes:
    return hashlib.sha256(url.encode()).digest()


def pixel_url(mail_kind: str, mail_id: int, subscriber_id: int | None) -> str:
    return f"{config.get().base_url}/o/{codes.open_code(mail_kind, mail_id, subscriber_id)}.gif"


def click_url(link_id: int, subscriber_id: int | None) -> str:
    return f"{config.get().base_url}/c/{codes.click_code(link_id, subscriber_id)}"


def ensure_links(mail_kind: str, mail_id: int, urls: list[str]) -> dict[str, int]:
    """url → email_links.id for every url, creating missing rows (idempotent, race-safe)."""
    if not urls:
        return {}
    by_hash = {url_hash(u): u for u in dict.fromkeys(urls)}
    values = [(mail_kind, mail_id, u, psycopg2.Binary(h)) for h, u in by_hash.items()]

    def insert(conn) -> dict[str, int]:
        # On the worker thread's kept connection. Outside a transaction the rows commit at once;
        # inside one (digest build) they are a savepoint of it, and that transaction commits
        # before the mail is handed to the provider: a sent mail's links are always committed.
        with db.transaction(conn) as cur:
            rows = psycopg2.extras.execute_values(
                cur,
                "INSERT INTO email_links (mail_kind, mail_id, url, url_hash) VALUES %s "
                "ON CONFLICT (mail_kind, mail_id, url_hash) DO NOTHING RETURNING id, url_hash",
                values, page_size=len(values), fetch=True,
            )
            found = {bytes(h): i for i, h in rows}
            missing = [psycopg2.Binary(h) for h in by_hash if h not in found]
            if missing:  # created earlier (another recipient's batch, another worker)
                cur.execute(
                    "SELECT id, url_hash FROM email_links WHERE mail_kind = %s AND mail_id = %s "
                    "AND url_hash = ANY(%s)", (mail_kind, mail_id, missing))
                found.update({bytes(h): i for i, h in cur.fetchall()})
        return {by_hash[h]: i for h, i in found.items()}

    return db.thread_connection.retry_once(insert)   # idempotent: ON CONFLICT DO NOTHING


class LinkRewriter:
    """One per mail (digest run or newsletter) and batch; reuse it for every recipient."""

    def __init__(self, mail_kind: str, mail_id: int):
        if mail_kind not in codes.MAIL_KINDS:
            raise ValueError(f"unknown mail kind {mail_kind!r}")
        self.mail_kind, self.mail_id = mail_kind, int(mail_id)
        self._link_ids: dict[str, int] = {}
        base = config.get().base_url
        self._untracked_prefixes = (f"{base}/u/", f"{base}/preferences/", f"{base}/c/", f"{base}/o/")

    def _trackable(self, url: str) -> bool:
        lower = url[:8].lower()
        if not (lower.startswith("http://") or lower.startswith("https://")):
            return False
        if len(url) > MAX_URL_LENGTH:
            return False
        return not url.startswith(self._untracked_prefixes)

    def rewrite(self, html: str, subscriber_id: int | None, enabled: bool = True) -> str:
        if not enabled or not config.get().tracking:
            return html
        tags = []  # (tag match, href match, url)
        for tag in _TAG_RE.finditer(html):
            href = _HREF_RE.search(tag.group(0))
            if not href:
                continue
            raw = next(g for g in href.groups()[1:] if g is not None)
            url = html_lib.unescape(raw).strip()
            if self._trackable(url):
                tags.append((tag, href, url))
        new_urls = [u for _, _, u in tags if u not in self._link_ids]
        if new_urls:
            self._link_ids.update(ensure_links(self.mail_kind, self.mail_id, new_urls))
        out, pos = [], 0
        for tag, href, url in tags:
            start = tag.start() + href.start()
            out.append(html[pos:start])
            # Click URLs are base64url + our base URL: nothing to escape inside the quotes.
            out.append(f'{href.group(1)}"{click_url(self._link_ids[url], subscriber_id)}"')
            pos = tag.start() + href.end()
        out.append(html[pos:])
        result = "".join(out)
        pixel = (f'<img src="{pixel_url(self.mail_kind, self.mail_id, subscriber_id)}" width="1" height="1" '
                 'alt="" style="display:block;border:0;width:1px;height:1px" />')
        ends = list(_BODY_END_RE.finditer(result))
        if ends:
            at = ends[-1].start()
            return result[:at] + pixel + result[at:]
        return result + pixel
