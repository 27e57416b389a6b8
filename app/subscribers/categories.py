"""The category registry: what an event `category` is called in digests and on the preference page.

`PUT /v1/categories/{key}` (admin) registers a label ("Comments"), a description (the preference
page's hint), a verb ("commented on": what the actors did, read before the entity's title) and a
delivery (`digest`, or `immediate` for "send now" categories). A category nobody registered is
shown by its humanised key ("new_comment" -> "New comment").

Readers never query per item or per digest: `registry()` is a snapshot of the whole table cached
in process for CACHE_SECONDS (a digest batch reads it at most once; a change made through the API is
seen at once by the process that made it and by every other process within CACHE_SECONDS).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from app.platform import db
from app.platform.validation import LINE_BREAK_OR_CONTROL, NO_CONTROL, SPACE_CLASS, Body, Text, check

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


class CategoryInput(Body):
    """PUT /v1/categories/{key}: how a category is shown."""

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
    delivery: Annotated[Literal[DELIVERIES], Field(description='`digest`, or `immediate` ("send now")')] = "digest"


FIELDS = tuple(CategoryInput.model_fields)


@dataclass(frozen=True)
class Category:
    key: str
    label: str
    description: str = ""
    verb: str = ""
    delivery: str = "digest"

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "verb": self.verb,
            "delivery": self.delivery,
        }


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
_COLUMNS = "key, label, description, verb, delivery"


def upsert(key: str, values: dict) -> tuple[dict, bool]:
    """Create or replace; returns (category, created)."""
    params = [key] + [values[f] for f in FIELDS]
    rows = db.query(
        f"INSERT INTO categories ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (key) DO UPDATE SET label = EXCLUDED.label, description = EXCLUDED.description, "
        "verb = EXCLUDED.verb, delivery = EXCLUDED.delivery, updated_at = now() "
        f"RETURNING {_COLUMNS}, (xmax = 0) AS created",
        params,
    )
    cache.clear()
    return Category(*rows[0][:-1]).as_dict(), rows[0][-1]


def get(key: str) -> dict | None:
    rows = db.query(f"SELECT {_COLUMNS} FROM categories WHERE key = %s", (key,))
    return Category(*rows[0]).as_dict() if rows else None


def list_all() -> list[dict]:
    return [Category(*row).as_dict() for row in db.query(f"SELECT {_COLUMNS} FROM categories ORDER BY key")]


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
            sql = f"SELECT {_COLUMNS} FROM categories"
            if cur is None:
                rows = db.query(sql)
            else:
                cur.execute(sql)
                rows = cur.fetchall()
            self._snapshot, self._loaded_at = {row[0]: Category(*row) for row in rows}, time.monotonic()
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


def lookup(key: str, reg: dict[str, Category]) -> Category:
    return reg.get(key) or unknown(key)
