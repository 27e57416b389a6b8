"""Newsletter templates: validated on create, compiled ONCE per newsletter, rendered per recipient.

Compilation = premailer (CSS inlined once, before Mustache: it is far too slow per mail) + chevron
tokenizing (cached token lists render about 2x faster than template strings). Templates see only
the recipient variables below; partials are refused (no file system access from user input).
"""
from __future__ import annotations

import html as html_lib
import logging
import re
import threading
from dataclasses import dataclass

import chevron
from chevron.tokenizer import ChevronError

log = logging.getLogger("app.newsletter.template")

VARIABLES = ("name", "email", "user_id", "unsubscribe_url", "preferences_url")
MAX_SUBJECT = 500
MAX_HTML = 512 * 1024
MAX_TEXT = 256 * 1024
MAX_FROM = 320


def tokenize(source: str) -> list:
    return list(chevron.tokenizer.tokenize(source))


def check(field: str, source: str) -> list[dict]:
    """Problems with one template as {field, message}: syntax, partials, unknown variables."""
    try:
        tokens = tokenize(source)
    except ChevronError as exc:
        return [{"field": field, "message": f"is not a valid Mustache template: {exc}"}]
    errors = []
    for kind, key in tokens:
        if kind == "partial":
            errors.append({"field": field, "message": f"partials are not supported ({{{{> {key}}}}})"})
        elif kind in ("variable", "no escape", "section", "inverted section") and key != "." \
                and key not in VARIABLES:
            errors.append({"field": field, "message": f"unknown variable {key!r}; available: {', '.join(VARIABLES)}"})
    return errors


def inline_css(source: str) -> str:
    """premailer once per template; Mustache tags survive it when written without inner spaces."""
    if "<style" not in source.lower():
        return source  # nothing to inline; premailer would only reformat the document
    import premailer

    try:
        return premailer.Premailer(
            source, keep_style_tags=False, remove_classes=False, disable_validation=True,
            cssutils_logging_level=logging.CRITICAL, allow_network=False, disable_link_rewrites=True,
        ).transform()
    except Exception as exc:  # a stylesheet premailer cannot parse must not block the send
        log.warning("premailer failed (%s); sending the HTML with its <style> block as written", exc)
        return source


_BLOCK_END = re.compile(r"(?i)<\s*(br\s*/?|/p|/div|/h[1-6]|/li|/tr|/table)\s*>")
_LINK = re.compile(r'(?is)<a\s[^>]*href="([^"]*)"[^>]*>(.*?)</a>')
_DROP = re.compile(r"(?is)<(style|script|head)[^>]*>.*?</\1\s*>")
_TAG = re.compile(r"(?s)<[^>]+>")


def text_from_html(source: str) -> str:
    """A plain-text alternative derived from the HTML template source (Mustache tags kept)."""
    text = _DROP.sub("", source)
    text = _LINK.sub(lambda m: f" {_TAG.sub('', m.group(2)).strip()} ({m.group(1)}) ", text)
    text = _BLOCK_END.sub("\n", text)
    text = html_lib.unescape(_TAG.sub("", text))
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _unescaped(tokens: list) -> list:
    """Text/subject parts are not HTML: render variables without HTML escaping."""
    return [("no escape", key) if kind == "variable" else (kind, key) for kind, key in tokens]


@dataclass(frozen=True)
class Rendered:
    subject: str
    html: str
    text: str


class Compiled:
    """One newsletter's templates, ready to render many recipients (thread-safe, read-only)."""

    def __init__(self, subject: str, html: str, text: str | None):
        self.subject_tokens = _unescaped(tokenize(subject))
        self.html_tokens = tokenize(inline_css(html))
        self.text_tokens = _unescaped(tokenize(text if text else text_from_html(html)))

    def render(self, context: dict) -> Rendered:
        subject = chevron.render(self.subject_tokens, context, partials_path=None)
        return Rendered(
            subject=" ".join(subject.split()),  # no header injection through a name with a newline
            html=chevron.render(self.html_tokens, context, partials_path=None),
            text=chevron.render(self.text_tokens, context, partials_path=None),
        )


_cache: dict[tuple, Compiled] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 32


def compiled_for(newsletter_id: int, subject: str, html: str, text: str | None) -> Compiled:
    """Per-process cache, keyed by id AND content (a content hash costs microseconds; premailer
    costs milliseconds to seconds), so a reused id (a restored or test database) never renders
    another newsletter's template."""
    key = (newsletter_id, hash((subject, html, text)))
    found = _cache.get(key)
    if found is not None:
        return found
    compiled = Compiled(subject, html, text)
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))
        _cache[key] = compiled
    return compiled
