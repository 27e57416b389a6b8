"""The emergency stop for all outgoing mail: the ESP suspended the account, a template is broken.

Engaged, it is one row in `mail_stop`; released, none. Where it takes effect:
  - no digest run and no newsletter row is claimed while it is engaged (the claim statements test
    NOT_ENGAGED), and the digest checker enqueues nothing;
  - a batch already at the provider stops between two mails: each send loop checks this row with
    its own controls at least every SEND_CHECK_SECONDS (app/newsletter/sender.py, digest/send.py);
    mails not started go back to `pending` without an attempt counted;
  - test sends are refused.
Released, nothing is lost: digest runs due meanwhile go out at the scheduler's next tick (late),
and every newsletter that was sending continues where it stopped. The callers of release() (the
CLI command, the dashboard) restart both: `digest.plan.forget_enqueued()` lets the checker enqueue
runs whose messages found the stop, `app.newsletter.kick.restart_sending()` enqueues send chains
(the scheduler's reclaim would too, once their alive marks expire).

`python -m app stop-sending --reason …` / `resume-sending`, the dashboard's button, and
`notify_mail_stopped` in /metrics are the ways in and out.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg2.extensions import connection as Connection

from app.platform import db

log = logging.getLogger("app.platform.mail_stop")

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


def engage(by: str, reason: str = "") -> dict[str, Any]:
    """Stop all outgoing mail (idempotent: a second stop keeps the first one's time and reason)."""
    inserted = db.query(_ENGAGE, (by, reason.strip()[:500]))
    if inserted:
        log.warning("EMERGENCY STOP engaged by %s: %s", by, reason or "(no reason given)")
    return {"stopped": True, "already": not inserted, **(state() or {})}


def release(by: str) -> bool:
    """Let mail go out again (the caller restarts the senders: see above). False if it was not engaged."""
    released = db.query(_RELEASE)
    if released:
        at, stopped_by, reason = released[0]
        log.warning(
            "emergency stop released by %s (engaged %s by %s: %s)",
            by,
            at.isoformat(),
            stopped_by,
            reason or "no reason given",
        )
    return bool(released)


def engaged_on(conn: Connection) -> bool:
    """From a send loop, on the connection it already holds."""
    with conn.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM mail_stop)")
        return bool(cur.fetchone()[0])
