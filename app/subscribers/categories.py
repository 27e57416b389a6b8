"""The category registry: what an event `category` is called in digests and on the preference page.

`PUT /v1/categories/{key}` (admin) registers a label ("Comments"), a description (the preference
page's hint), a verb ("commented on": what the actors did, read before the entity's title) and a
delivery (`digest`, or `immediate` for "send now" categories). A category nobody registered is
shown by its humanised key ("new_comment" -> "New comment").

Readers never query per item or per digest: `registry()` is a snapshot of the whole table cached
in process for CACHE_SECONDS (a digest batch reads it at most once; a change made through the API is
seen at once by the process that made it and by every other process within CACHE_SECONDS).

Translations (issue 39; docs/i18n.md "Translating categories"): `translations` holds a label,
description and verb per locale tag (normalised: `pt-BR`). `lookup(key, registry, tag)` gives the
category in a reader's words: the translation of the first locale of the reader's fallback chain
(`de-CH` -> `de` -> DEFAULT_LOCALE -> `en`, app/platform/i18n.py `chain`) that has one, whole (its
verb, even empty, is that language's: an empty verb words the line with the label), else the
category's own words. The verb's word order and preposition are the translator's.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import orjson
from pydantic import AfterValidator, BeforeValidator, Field

from app.platform import db, i18n
from app.platform.validation import (
    LINE_BREAK_OR_CONTROL,
    NO_CONTROL,
    SPACE_CLASS,
    Body,
    LocaleKey,
    Text,
    check,
    distinct_locales,
    keyed,
)

KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,100}$"
KEY_RULE = "must be 1-100 characters: ASCII letters, digits, '.', '_', ':' or '-'"
DELIVERIES = ("digest", "immediate")
CACHE_SECONDS = 30.0
# A label must show something: at least one visible character, no line breaks or control characters.
_LABEL = f"^[^{LINE_BREAK_OR_CONTROL}]*[^{SPACE_CLASS}{LINE_BREAK_OR_CONTROL}][^{LINE_BREAK_OR_CONTROL}]*$"
_KEY_RE = re.compile(KEY_PATTERN)
_SEPARATORS = re.compile(r"[\s._:-]+")


def _strip(value: str) -> str:
    return " ".join(value.split())


MAX_TRANSLATIONS = 40  # locales per category


class CategoryText(Body):
    """How a category is shown in one language (the fields of a translation)."""

    label: Annotated[
        Text(
            100,
            _LABEL,
            min_length=1,
            message="must show at least one character and contain no line breaks or control characters",
            description='shown as the topic\'s name: "Comments"',
        ),
        AfterValidator(_strip),
    ]
    description: Annotated[
        Text(500, NO_CONTROL, description="one sentence under the topic on the preference page"), AfterValidator(_strip)
    ] = ""
    verb: Annotated[
        Text(
            60,
            NO_CONTROL,
            description="what the actors did, read before the entity's title: "
            '"liked", "commented on" ("Eli commented on Launch notes"; '
            "inside the entity's block a trailing preposition is dropped: "
            '"Eli commented"). Empty: "Comments from Eli"',
        ),
        AfterValidator(_strip),
    ] = ""


class CategoryInput(CategoryText):
    """PUT /v1/categories/{key}: how a category is shown."""

    delivery: Annotated[Literal[DELIVERIES], Field(description='`digest`, or `immediate` ("send now")')] = "digest"
    translations: Annotated[
        dict[LocaleKey, CategoryText],
        Field(
            max_length=MAX_TRANSLATIONS,
            description="the label, description and verb in other languages, by locale tag "
            '(`{"pt-BR": {"label": "Curtidas", "verb": "curtiu"}}`); a reader gets the first locale of '
            "their fallback chain that has one (de-CH, de, DEFAULT_LOCALE, en), else the fields above. "
            "A translated verb is used as written: its word order and preposition are the translator's",
        ),
        BeforeValidator(distinct_locales),
    ] = {}


keyed("translations")
TEXT_FIELDS = tuple(CategoryText.model_fields)  # label, description, verb
FIELDS = tuple(f for f in CategoryInput.model_fields if f != "translations")


@dataclass(frozen=True)
class Category:
    key: str
    label: str
    description: str = ""
    verb: str = ""
    delivery: str = "digest"
    # ((tag, label, description, verb), …) sorted by tag: hashable, as digests cache per category
    translations: tuple[tuple[str, str, str, str], ...] = ()
    locale: str | None = None  # whose words label/description/verb are: a translation's tag (None: the default)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "verb": self.verb,
            "delivery": self.delivery,
            "translations": {
                tag: {"label": label, "description": description, "verb": verb}
                for tag, label, description, verb in self.translations
            },
        }

    def words(self, tag: str | None) -> Category:
        """This category in the words of locale `tag` (see the module docstring); None: its own."""
        if not self.translations or not tag:
            return self
        return _localized(self, tag)


@functools.lru_cache(maxsize=4096)
def _localized(category: Category, tag: str) -> Category:
    found = {t[0]: t for t in category.translations}
    for candidate in i18n.chain(tag):
        if candidate in found:
            _, label, description, verb = found[candidate]
            return replace(category, label=label, description=description, verb=verb, locale=candidate)
    return category


def _translations(stored) -> tuple[tuple[str, str, str, str], ...]:
    if not stored:
        return ()
    if isinstance(stored, str | bytes):
        stored = orjson.loads(stored)
    return tuple(sorted((tag, t["label"], t.get("description", ""), t.get("verb", "")) for tag, t in stored.items()))


def _category(row) -> Category:
    *fields, translations = row
    return Category(*fields, translations=_translations(translations))


def valid_key(key) -> bool:
    return isinstance(key, str) and _KEY_RE.fullmatch(key) is not None


def humanise(key: str) -> str:
    """ "new_comment" -> "New comment", "pr.review-requested" -> "Pr review requested"."""
    words = _SEPARATORS.sub(" ", key).strip() or key
    return words[:1].upper() + words[1:]


@functools.lru_cache(maxsize=4096)
def unknown(key: str) -> Category:
    """An unregistered category, labelled by its humanised key (cached: digests ask per line)."""
    return Category(key, humanise(key))


def validate(data) -> tuple[dict, list[dict]]:
    model, errors = check(CategoryInput, data)
    return (model.model_dump() if model else {}), errors


# -- the table ------------------------------------------------------------------------------------
_COLUMNS = "key, label, description, verb, delivery, translations"
# What reads select: translations through the row's JSON, so a process reading the registry of a
# database not yet at migration 0730 (a release's code beside the previous schema) reads none.
_READ = "key, label, description, verb, delivery, to_jsonb(categories) -> 'translations'"


def upsert(key: str, values: dict) -> tuple[dict, bool]:
    """Create or replace (translations included: those left out are gone); returns (category, created)."""
    translations = values.get("translations") or {}
    stored = orjson.dumps({tag: {f: t[f] for f in TEXT_FIELDS} for tag, t in translations.items()}).decode()
    params = [key] + [values[f] for f in FIELDS] + [stored if translations else None]
    rows = db.query(
        f"INSERT INTO categories ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s::jsonb) "
        "ON CONFLICT (key) DO UPDATE SET label = EXCLUDED.label, description = EXCLUDED.description, "
        "verb = EXCLUDED.verb, delivery = EXCLUDED.delivery, translations = EXCLUDED.translations, "
        f"updated_at = now() RETURNING {_COLUMNS}, (xmax = 0) AS created",
        params,
    )
    cache.clear()
    return _category(rows[0][:-1]).as_dict(), rows[0][-1]


def get(key: str) -> dict | None:
    rows = db.query(f"SELECT {_READ} FROM categories WHERE key = %s", (key,))
    return _category(rows[0]).as_dict() if rows else None


def list_all() -> list[dict]:
    return [_category(row).as_dict() for row in db.query(f"SELECT {_READ} FROM categories ORDER BY key")]


def delete(key: str) -> bool:
    deleted = bool(db.query("DELETE FROM categories WHERE key = %s RETURNING key", (key,)))
    cache.clear()
    return deleted


class _Cache:
    """The whole registry, refreshed at most every CACHE_SECONDS (one small SELECT)."""

    def __init__(self):
        self._snapshot: dict[str, Category] | None = None
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def get(self, cur=None) -> dict[str, Category]:
        snapshot = self._snapshot
        if snapshot is not None and time.monotonic() - self._loaded_at < CACHE_SECONDS:
            return snapshot
        with self._lock:
            if self._snapshot is not None and time.monotonic() - self._loaded_at < CACHE_SECONDS:
                return self._snapshot
            sql = f"SELECT {_READ} FROM categories"
            if cur is None:
                rows = db.query(sql)
            else:
                cur.execute(sql)
                rows = cur.fetchall()
            self._snapshot, self._loaded_at = {row[0]: _category(row) for row in rows}, time.monotonic()
            return self._snapshot

    def clear(self) -> None:
        with self._lock:
            self._snapshot = None


cache = _Cache()


def registry(cur=None) -> dict[str, Category]:
    """{key: Category} of every registered category (cached; `cur`: read with the caller's cursor
    when the cache is stale, e.g. inside a digest batch's transaction)."""
    return cache.get(cur)


def send_now_keys(reg: dict[str, Category]) -> list[str]:
    """The categories whose events bypass the digest (delivery `immediate`)."""
    return sorted(key for key, c in reg.items() if c.delivery == "immediate")


def lookup(key: str, reg: dict[str, Category], tag: str | None = None) -> Category:
    """The category of `key` (an unregistered one: its humanised key), in the words of locale `tag`
    (a reader's translator's `t.tag`: the first translation along its fallback chain, else the
    category's own words); None: its own words."""
    category = reg.get(key) or unknown(key)
    return category.words(tag) if tag else category
