"""Link rewriting at render time (digests and newsletters).

Digest and newsletter rendering call LinkRewriter(mail_kind, mail_id).rewrite(html, subscriber_id,
enabled) on each recipient's final HTML: every http(s) link of an <a>/<area> becomes a click URL
({BASE_URL}/c/<code>) and a 1x1 open pixel ({BASE_URL}/o/<code>.gif) is added before </body>: an <img>
in a mail with pictures, else a 1x1 table's background (pixel_html).

email_links holds one row per (mail, url), never per recipient: the recipient is inside the signed
code. Rows are created with INSERT … ON CONFLICT DO NOTHING (two workers rendering the same mail
agree on one row) and the url → link id map is cached in the rewriter, so a batch of recipients
pays one DB round trip per new URL set, not per recipient.

Left alone: non-http(s) links (mailto:, tel:, #anchors), our own unsubscribe / preference links
(they must work without a redirect hop and are what RFC 8058 clients look for), a digest's "view
in your browser" link (unique per mail: tracking it would add an email_links row per digest), and links that
are already tracking URLs. With TRACKING=off or enabled=False (per-subscriber opt-out) the HTML
is returned unchanged: clean links and no pixel.
"""

from __future__ import annotations

import hashlib
import logging
import re

from app.platform import config, db
from tracking import codes, hrefs

log = logging.getLogger("tracking.links")

MAX_URL_LENGTH = 8192
_BODY_END_RE = re.compile(r"</body\s*>", re.IGNORECASE)


def url_hash(url: str) -> bytes:
    return hashlib.sha256(url.encode()).digest()


def pixel_url(mail_kind: str, mail_id: int, subscriber_id: int | None) -> str:
    return f"{config.get().base_url}/o/{codes.open_code(mail_kind, mail_id, subscriber_id)}.gif"


def click_url(link_id: int, subscriber_id: int | None) -> str:
    return f"{config.get().base_url}/c/{codes.click_code(link_id, subscriber_id)}"


def ensure_links(mail_kind: str, mail_id: int, urls: list[str]) -> dict[str, int]:
    """url → email_links.id for every url, creating missing rows (idempotent, race-safe)."""
    return ensure_links_many(mail_kind, {mail_id: urls}).get(int(mail_id), {})


# The hash is computed by Postgres (the same sha256 as url_hash()) and rows are matched back by
# (mail_id, url): two arrays in, no bytea adapted or hashed per link in Python (6 links a digest).
INSERT_LINKS = """
INSERT INTO email_links (mail_kind, mail_id, url, url_hash)
SELECT %s, v.mail_id, v.url, sha256(convert_to(v.url, 'UTF8')) FROM unnest(%s::bigint[], %s::text[]) AS v(mail_id, url)
ON CONFLICT (mail_kind, mail_id, url_hash) DO NOTHING RETURNING mail_id, url, id
"""
EXISTING_LINKS = """
SELECT w.mail_id, w.url, l.id FROM unnest(%s::bigint[], %s::text[]) AS w(mail_id, url)
JOIN email_links l ON l.mail_kind = %s AND l.mail_id = w.mail_id AND l.url_hash = sha256(convert_to(w.url, 'UTF8'))
"""


def ensure_links_many(mail_kind: str, urls_by_mail: dict[int, list[str]]) -> dict[int, dict[str, int]]:
    """{mail_id: {url: email_links.id}} for several mails of one kind in one round trip (a digest
    batch: one statement for a hundred runs instead of one each)."""
    wanted = list(dict.fromkeys((int(mail_id), u) for mail_id, urls in urls_by_mail.items() for u in urls))
    if not wanted:
        return {}

    def insert(conn) -> dict[tuple[int, str], int]:
        # On the worker thread's kept connection. Outside a transaction the rows commit at once;
        # inside one (digest build) they are a savepoint of it, and that transaction commits
        # before the mail is handed to the provider: a sent mail's links are always committed.
        with db.transaction(conn) as cur:
            # Each array as one literal (db.pg_text_array): ARRAY[...] is parsed element by element.
            cur.execute(
                INSERT_LINKS, (mail_kind, db.pg_array([m for m, _ in wanted]), db.pg_text_array([u for _, u in wanted]))
            )
            found = {(m, u): i for m, u, i in cur.fetchall()}
            missing = [key for key in wanted if key not in found]
            if missing:  # created earlier (another recipient's batch, another worker)
                cur.execute(
                    EXISTING_LINKS,
                    (db.pg_array([m for m, _ in missing]), db.pg_text_array([u for _, u in missing]), mail_kind),
                )
                found.update({(m, u): i for m, u, i in cur.fetchall()})
        return found

    found = db.thread_connection.retry_once(insert)  # idempotent: ON CONFLICT DO NOTHING
    out: dict[int, dict[str, int]] = {}
    for (mail_id, url), link_id in found.items():
        out.setdefault(mail_id, {})[url] = link_id
    return out


class LinkRewriter:
    """One per mail (digest run or newsletter) and batch; reuse it for every recipient."""

    def __init__(self, mail_kind: str, mail_id: int):
        if mail_kind not in codes.MAIL_KINDS:
            raise ValueError(f"unknown mail kind {mail_kind!r}")
        self.mail_kind, self.mail_id = mail_kind, int(mail_id)
        self._link_ids: dict[str, int] = {}
        base = config.get().base_url
        self._untracked_prefixes = (f"{base}/u/", f"{base}/preferences/", f"{base}/v/", f"{base}/c/", f"{base}/o/")

    def trackable(self, url: str) -> bool:
        """Whether a link to `url` is rewritten: http(s), not too long, not one of our own links."""
        lower = url[:8].lower()
        if not (lower.startswith("http://") or lower.startswith("https://")):
            return False
        if len(url) > MAX_URL_LENGTH:
            return False
        return not url.startswith(self._untracked_prefixes)

    def rewrite(self, html: str, subscriber_id: int | None, enabled: bool = True) -> str:
        return rewrite_many(self.mail_kind, [(self, html, subscriber_id, enabled)])[0]

    def _scan(self, html: str) -> list[hrefs.Href]:
        return [href for href in hrefs.find(html) if self.trackable(href.url)]

    def _apply(self, html: str, found: list[hrefs.Href], subscriber_id: int | None) -> tuple[str, dict[str, str]]:
        clicks: dict[str, str] = {}
        for href in found:
            if href.url not in clicks:  # a URL linked twice in one mail is signed once
                clicks[href.url] = click_url(self._link_ids[href.url], subscriber_id)
        # Click URLs are base64url + our base URL: nothing to escape inside the quotes.
        result = hrefs.replace(html, [(href, clicks[href.url]) for href in found])
        pixel = pixel_html(pixel_url(self.mail_kind, self.mail_id, subscriber_id), result)
        ends = list(_BODY_END_RE.finditer(result))
        if ends:
            at = ends[-1].start()
            return result[:at] + pixel + result[at:], clicks
        return result + pixel, clicks


_IMG_RE = re.compile(r"<img\b", re.IGNORECASE)


def erase_mails(cur: db.Cursor, mail_kind: str, mail_ids: list[int]) -> None:
    """The link rows of these mails (an erased subscriber's digests: their URLs came from that
    person's events). Their legacy codes go with them (ON DELETE CASCADE)."""
    cur.execute("DELETE FROM email_links WHERE mail_kind = %s AND mail_id = ANY(%s)", (mail_kind, mail_ids))


def pixel_html(url: str, html: str) -> str:
    """The open pixel for this mail. A mail that shows pictures gets it as a 1x1 <img>. A mail without
    any keeps none: to a spam filter a short text with a single <img> reads as an image mail
    (SpamAssassin's HTML_IMAGE_ONLY_* count the words beside any <img>), so the same URL is the
    background of a 1x1 table, which clients that load images fetch alike. (Pixel URLs are our base
    URL and base64url: nothing to escape.)"""
    if _IMG_RE.search(html):
        return f'<img src="{url}" width="1" height="1" alt="" style="display:block;border:0;width:1px;height:1px" />'
    return (
        f'<table role="presentation" width="1" height="1" cellpadding="0" cellspacing="0" border="0" '
        f'background="{url}" style="background-image:url({url});width:1px;height:1px"><tr><td></td></tr></table>'
    )


def rewrite_many(mail_kind: str, jobs: list[tuple[LinkRewriter, str, int | None, bool]]) -> list[str]:
    """Each job's HTML rewritten (job: rewriter, html, subscriber_id, enabled), with the links of
    every mail not seen yet created in one round trip."""
    return [html for html, _ in rewrite_many_with_clicks(mail_kind, jobs)]


def rewrite_many_with_clicks(
    mail_kind: str, jobs: list[tuple[LinkRewriter, str, int | None, bool]]
) -> list[tuple[str, dict[str, str]]]:
    """rewrite_many, each HTML with its {original URL: click URL} (empty when not tracked), so a
    plain-text part can carry the same tracked links."""
    tracking_on = config.get().tracking
    scanned = [rewriter._scan(html) if enabled and tracking_on else None for rewriter, html, _, enabled in jobs]
    new: dict[int, list[str]] = {}
    for (rewriter, _, _, _), tags in zip(jobs, scanned):
        for href in tags or ():
            if href.url not in rewriter._link_ids:
                new.setdefault(rewriter.mail_id, []).append(href.url)
    if new:
        created = ensure_links_many(mail_kind, new)
        for rewriter, _, _, _ in jobs:
            rewriter._link_ids.update(created.get(rewriter.mail_id, {}))
    return [
        (html, {}) if tags is None else rewriter._apply(html, tags, subscriber_id)
        for (rewriter, html, subscriber_id, _), tags in zip(jobs, scanned)
    ]
