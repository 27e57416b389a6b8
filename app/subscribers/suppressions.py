"""The suppression list: every statement that writes `suppressions` (one row per canonical
address, README "Address identity"). Whether an address may be mailed is read through
app/subscribers/mailable.py; the dashboard's search and audited removal are in
app/operations/suppressions.py, which calls `remove` here.

Writers: a provider's webhook event, SendGrid's, SES's, Postmark's or Mailgun's (bounce, block, spam
report, unsubscribe, too many soft bounces: tracking/webhook_apply.py), erasure
(app/operations/erasure.py, reason 'erased', which no later event replaces), an operator's addition
and removal, and the canonical-form backfill (app/subscribers/rekey.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.platform import db

COLUMNS = "id, email, reason, source, created_at"


@dataclass(frozen=True)
class Suppression:
    id: int
    email: str  # canonical
    reason: str
    source: str | None
    created_at: datetime


def suppress(cur: db.Cursor, address: str, reason: str, source: str) -> bool:
    """Suppress the canonical `address`; an address already suppressed keeps its first reason. True
    when this added it."""
    if not address:
        return False
    cur.execute(
        "INSERT INTO suppressions (email, reason, source) VALUES (%s, %s, %s) ON CONFLICT (email) DO NOTHING "
        "RETURNING id",
        (address, reason, source),
    )
    return cur.fetchone() is not None


def find(cur: db.Cursor, address: str) -> Suppression | None:
    """The suppression of this canonical address, if any."""
    cur.execute(f"SELECT {COLUMNS} FROM suppressions WHERE email = %s", (address,))
    row = cur.fetchone()
    return Suppression(*row) if row else None


def keep_erased(cur: db.Cursor, address: str) -> None:
    """Erasure keeps the canonical address, and any earlier reason in `source` (bounce, spamreport...:
    not personal, useful to support); no later event replaces 'erased'."""
    cur.execute(
        "INSERT INTO suppressions (email, reason, source) VALUES (%s, 'erased', 'erasure') "
        "ON CONFLICT (email) DO UPDATE SET reason = 'erased', "
        "source = 'erasure, was ' || suppressions.reason WHERE suppressions.reason <> 'erased'",
        (address,),
    )


def remove(cur: db.Cursor, suppression_id: int) -> Suppression | None:
    """Delete one row; returns it, None when it was already gone."""
    cur.execute(f"DELETE FROM suppressions WHERE id = %s RETURNING {COLUMNS}", (suppression_id,))
    row = cur.fetchone()
    return Suppression(*row) if row else None


def merge_into_canonical(cur: db.Cursor, row_id: int, key: str) -> int:
    """Rewrite one suppression to its canonical `key`, merging it with the row that holds `key`
    already (app/subscribers/rekey.py): the earliest row is kept, 'erased' wins over any reason,
    the merged rows' reasons and sources are appended to its source. 1 if it changed, else 0."""
    cur.execute(
        f"SELECT {COLUMNS} FROM suppressions WHERE id = %s OR email = %s ORDER BY created_at, id FOR UPDATE",
        (row_id, key),
    )
    rows = cur.fetchall()
    if not any(r[0] == row_id and r[1] != key for r in rows):
        return 0  # removed or rewritten meanwhile
    kept, *merged = rows
    reason = "erased" if any(r[2] == "erased" for r in rows) else kept[2]
    source = kept[3]
    if merged:
        source = "; ".join(filter(None, [kept[3], *(f"merged {r[2]} ({r[3] or 'no source'})" for r in merged)]))
        cur.execute("DELETE FROM suppressions WHERE id = ANY(%s)", ([r[0] for r in merged],))
    cur.execute(
        "UPDATE suppressions SET email = %s, reason = %s, source = %s WHERE id = %s", (key, reason, source, kept[0])
    )
    return 1
