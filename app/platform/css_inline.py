"""The one premailer wrapper: a mail's <style> rules inlined into style attributes (many mail clients
drop <style>), run once per template version over the Mustache source, never per mail.

Mustache tags survive it when attributes are written href="{{url}}" (no inner spaces, which
premailer would turn into %20) and no base_url is set; callers compare the tags before and after
(app/platform/mustache.py `tags`)."""

from __future__ import annotations

import logging


def inline_css(html: str, *, strip_important: bool) -> str:
    """`html` with its CSS inlined and its <style> blocks removed; classes kept, no network access.
    `strip_important`: drop `!important` from the inlined declarations (newsletters do; the digest
    template keeps them). premailer's errors propagate: the caller decides what a failure means."""
    import premailer  # measured 248 ms to import (cssutils); only template compiles need it

    inlined: str = premailer.Premailer(
        html,
        keep_style_tags=False,
        remove_classes=False,
        strip_important=strip_important,
        disable_validation=True,
        cssutils_logging_level=logging.CRITICAL,
        allow_network=False,
        disable_link_rewrites=True,  # links are Mustache tags; nothing is relative to a base URL
    ).transform()
    return inlined
