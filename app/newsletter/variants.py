"""Newsletters in several languages: which variant each recipient gets.

A newsletter has its default subject/html/text and, optionally, `variants` by locale tag
(`{"pt-BR": {"subject", "html", "text"}, …}`, normalised tags). A recipient gets the variant of the
first of these that matches, else the default:

1. their locale (`pt-PT`; none set: DEFAULT_LOCALE);
2. its language (`pt`) — and a language matches a variant of any region of it: a `pt-PT` reader with
   no `pt-PT` or `pt` variant gets the `pt-BR` one (the first by tag when a language has several),
   since Portuguese of another region reads better than another language. The pseudo-locale `en-XA`
   is never matched by a language: only by its own tag;
3. DEFAULT_LOCALE's chain (app/platform/i18n.py `chain`: `de-CH`, `de`, then `en`), each step the same way.

The outbox chooses when it writes the recipient's row (`email_log.variant`, NULL: the default), so
every mail of the row is rendered from one variant (a retry too) and GET /v1/newsletters/{id} counts
per variant without deciding again; a locale changed after the outbox was written applies to the
next newsletter. The words the service adds (greeting, footer, the `[Test]` prefix) and the mail's
`lang`/`dir` are in the variant's language; with the default, in the recipient's locale.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.platform import config, i18n

DEFAULT = None  # the default variant's key (email_log.variant NULL)
# The parameters of the outbox's statements when a newsletter has no variants.
NONE: dict[str, object] = {"variant_keys": [], "variant_values": [], "variant_default": None}


def _language(tag: str) -> str:
    return tag.split("-")[0]


def _matches(tags: list[str], candidate: str) -> str | None:
    """The variant a candidate of the chain selects: its own tag; a bare language also any region's."""
    if candidate in tags:
        return candidate
    if "-" not in candidate:
        return next((t for t in tags if t != i18n.PSEUDO and _language(t) == candidate), None)
    return None


def _tail(tags: list[str]) -> str | None:
    for candidate in i18n.chain(config.get().default_locale):
        found = _matches(tags, candidate)
        if found:
            return found
    return None


def choose(variants: Iterable[str], locale: str | None) -> str | None:
    """The variant (its tag) a reader of `locale` (a stored, normalised tag; None: DEFAULT_LOCALE)
    gets; None: the default."""
    tags = sorted(variants)
    if not tags:
        return None
    if locale:
        for candidate in (locale, _language(locale)):
            found = _matches(tags, candidate)
            if found:
                return found
    return _tail(tags)


def parameters(variants: Iterable[str]) -> dict[str, object]:
    """What the outbox's INSERT … SELECT needs to choose as choose() does, for a whole chunk in one
    statement: `variant_keys`/`variant_values` (a locale or a language -> its variant), matched by the
    subscriber's locale, then by its language; else `variant_default` (a NULL locale too)."""
    tags = sorted(variants)
    if not tags:
        return NONE
    keys = {t: t for t in tags}
    for language in sorted({_language(t) for t in tags}):
        found = _matches(tags, language)
        if found:
            keys.setdefault(language, found)
    return {"variant_keys": list(keys), "variant_values": list(keys.values()), "variant_default": _tail(tags)}


def render_locale(variant: str | None, locale: str | None) -> str | None:
    """The locale of the words the service adds to a mail of `variant` for a reader of `locale`."""
    return variant if variant is not None else locale
