"""The suppression list for operators: search, and remove one address (audited).

Search is a substring of the stored address, which is in canonical form (README "Address
identity"), so the text is compared in that form too: any case, full-width forms, and a Unicode
domain or whole label in either spelling ("Bücher.example" finds `ana@xn--bcher-kva.example`) —
"gmail.com", "ana@" — newest first, PAGE_SIZE per page and at most MAX_PAGE pages (a search
narrower than that finds anything further back). LIKE wildcards typed by the operator are matched literally. With no
search the newest rows come straight from the primary key; a search reads the table (bounded by
the statement timeout), which at a million suppressions is a fraction of a second.

Removing a row lets mail reach the address again from the next claim on. It happens in one
transaction with its audit row (admin_audit: which API key, when, from where, which address,
the suppression's reason, source and age, and the operator's note) and resets that address's
soft-bounce count, so a deferral right after does not suppress it again at once.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from datetime import datetime

from app.platform import db
from app.platform.addresses import canonical
from app.subscribers import records as subscribers
from app.subscribers import suppressions as suppression_list

PAGE_SIZE = 50
MAX_PAGE = 200
MAX_SEARCH_CHARS = 254  # the longest address there can be
MAX_NOTE_CHARS = 500
STATEMENT_TIMEOUT = "5s"
ACTION_REMOVE = "suppression.remove"


class BadInput(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Suppression:
    id: int
    email: str
    reason: str
    source: str | None
    created_at: datetime


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
            f"SELECT id, email, reason, source, created_at FROM suppressions {where} "
            "ORDER BY id DESC LIMIT %s OFFSET %s",
            [*params, size + 1, (page - 1) * size],
        )
        rows = cur.fetchall()
    return [Suppression(*row) for row in rows[:size]], len(rows) > size


def get(suppression_id: int) -> Suppression | None:
    rows = db.query("SELECT id, email, reason, source, created_at FROM suppressions WHERE id = %s", (suppression_id,))
    return Suppression(*rows[0]) if rows else None


def remove(
    suppression_id: int, key_id: int, key_name: str, ip: str | None, note: str, session_id: int | None = None
) -> Suppression | None:
    """Delete the row, reset the address's soft-bounce count and write the audit row, all or
    nothing. None when there is no such row (already removed)."""
    with db.raw_cursor() as cur:
        row = suppression_list.remove(cur, suppression_id)
        if row is None:
            return None
        removed = Suppression(*row)
        subscribers.reset_soft_bounces(cur, None, removed.email)
        detail = {
            "suppression_id": removed.id,
            "reason": removed.reason,
            "source": removed.source,
            "suppressed_at": removed.created_at.isoformat(),
            "note": note,
            "session_id": session_id,
        }
        cur.execute(
            "INSERT INTO admin_audit (api_key_id, api_key_name, action, target, detail, ip) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (key_id, key_name, ACTION_REMOVE, removed.email, json.dumps(detail), ip),
        )
    return removed


def recent_audit(limit: int = 10) -> list[tuple]:
    """The latest audited changes: (at, key name, key id, action, target, detail)."""
    return db.query(
        "SELECT at, api_key_name, api_key_id, action, target, detail FROM admin_audit ORDER BY id DESC LIMIT %s",
        (limit,),
    )
