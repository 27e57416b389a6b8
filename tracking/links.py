"""Placeholder with the final interface (filled in by the tracking issue).

Digest and newsletter rendering call LinkRewriter(mail_kind, mail_id).rewrite(html, subscriber_id,
enabled) on each recipient's final HTML: every http(s) link becomes a click URL and a 1x1 open pixel
is added; one email_links row per (mail, url), never per recipient.
"""
from __future__ import annotations


class LinkRewriter:
    def __init__(self, mail_kind: str, mail_id: int):
        self.mail_kind, self.mail_id = mail_kind, mail_id

    def rewrite(self, html: str, subscriber_id: int, enabled: bool = True) -> str:
        return html
