"""The emergency stop for all outgoing mail: the ESP suspended the account, a template is broken.

Engaged, it is one row in `mail_stop`; released, none. Where it takes effect:
  - no digest run and no newsletter row is claimed while it is engaged (the claim statements test
    NOT_ENGAGED), and the digest checker enqueues nothing;
  - a batch already at the provider stops between two mails: each send loop checks this row with
    its own controls at least every SEND_CHECK_SECONDS (app/newsletter/sender.py, digest/send.py);
    mails not started go back to `pending` without an attempt counted;
  - test sends are refused.
Released, nothing is lost: digest runs due meanwhile go out at the scheduler's next tick (late),
and every newsletter that was sending continues where it stopped. Engaging and releasing are
app/operations/sending.py's (audited, and the release restarts both senders); the CLI's
`stop-sending --reason …` / `resume-sending` and the dashboard's button call it, and
`notify_mail_stopped` in /metrics shows the state.
"""

from __future__ import annotations

from typing import Any

from psycopg2.extensions import connection as Connection

from app.platform import db

# For the claim statements: a condition true while mail may go out.
NOT_ENGAGED = "NOT EXISTS (SELECT 1 FROM mail_stop)"
SEND_CHECK_SECONDS = 0.25

_ENGAGE = """
INSERT INTO mail_stop (engaged_by, reason) VALUES (%s, %s) ON CONFLICT (engaged) DO NOTHING
RETURNING engaged_at
"""
_RELEASE = "DELETE FROM mail_stop RETURNING engaged_at, engaged_by, reason"
_STATE = "SELECT engaged_at, engaged_by, reason FROM mail_stop"


def state() -> dict[str, Any] | None:
    """None while mail may go out; else when, by whom and why it was stopped."""
    rows = db.query(_STATE)
    if not rows:
        return None
    at, by, reason = rows[0]
    return {"engaged_at": at.isoformat(), "engaged_by": by, "reason": reason}


def engage(cur: db.Cursor, by: str, reason: str) -> bool:
    """Stop all outgoing mail, in the caller's transaction. False if it was engaged already (a second
    stop keeps the first one's time and reason)."""
    cur.execute(_ENGAGE, (by, reason))
    return cur.fetchone() is not None


def release(cur: db.Cursor) -> tuple[Any, ...] | None:
    """Let mail go out again, in the caller's transaction (who restarts the senders: see above).
    (engaged_at, engaged_by, reason) of the stop released; None if it was not engaged."""
    cur.execute(_RELEASE)
    row: tuple[Any, ...] | None = cur.fetchone()
    return row


def engaged_on(conn: Connection) -> bool:
    """From a send loop, on the connection it already holds."""
    with conn.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM mail_stop)")
        return bool(cur.fetchone()[0])
