"""The suppression list for operators: search, and remove one address (audited).

Search is a substring of the stored address, which is in canonical form (README "Address
identity"), so the text is compared in that form too: any case, full-width forms, and a Unicode
domain or whole label in either spelling ("Bücher.example" finds `ana@xn--bcher-kva.example`) —
"gmail.com", "ana@" — newest first, PAGE_SIZE per page and at most MAX_PAGE pages (a search
narrower than that finds anything further back). LIKE wildcards typed by the operator are matched literally. With no
search the newest rows come straight from the primary key; a search reads the table (bounded by
the statement timeout), which at a million suppressions is a fraction of a second.

Removing a row is app/operations/suppressions.py's (audited); the confirmation page and its form are
app/web/admin/views.py's.
"""

from __future__ import annotations

import unicodedata

from app.platform import db
from app.platform.addresses import canonical
from app.subscribers.suppressions import COLUMNS, Suppression

PAGE_SIZE = 50
MAX_PAGE = 200
MAX_SEARCH_CHARS = 254  # the longest address there can be
MAX_NOTE_CHARS = 500
STATEMENT_TIMEOUT = "5s"


class BadInput(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def clean_text(value: str | None, field: str, limit: int) -> str:
    """Trimmed text; BadInput for control characters (NUL and friends cannot reach Postgres) or
    anything over `limit` characters."""
    value = (value or "").strip()
    if len(value) > limit:
        raise BadInput(field, f"at most {limit} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise BadInput(field, "control characters are not allowed")
    return value


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def search_forms(text: str) -> list[str]:
    """The canonical forms a search text may take in a stored address: the text as an address (or
    its start), and, without an `@`, also as a domain (its Unicode labels as A-labels)."""
    forms = {canonical(text)}
    if "@" not in text:
        forms.add(canonical("@" + text)[1:])
    return sorted(forms)


def search(text: str, page: int, size: int = PAGE_SIZE) -> tuple[list[Suppression], bool]:
    """Matching suppressions of page `page` (1-based), newest first, and whether a next page exists."""
    where, params = "", []
    if text:  # LIKE's default escape character is the backslash _like_pattern uses
        where, params = "WHERE email LIKE ANY(%s)", [[_like_pattern(form) for form in search_forms(text)]]
    with db.raw_cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        cur.execute(
            f"SELECT {COLUMNS} FROM suppressions {where} ORDER BY id DESC LIMIT %s OFFSET %s",
            [*params, size + 1, (page - 1) * size],
        )
        rows = cur.fetchall()
    return [Suppression(*row) for row in rows[:size]], len(rows) > size


def get(suppression_id: int) -> Suppression | None:
    rows = db.query(f"SELECT {COLUMNS} FROM suppressions WHERE id = %s", (suppression_id,))
    return Suppression(*rows[0]) if rows else None
