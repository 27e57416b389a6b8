"""The emergency stop for all outgoing mail (app/platform/mail_stop.py says where it holds), engaged
and released by an operator from the dashboard or a shell: each change in one transaction with its
audit row. A release restarts both senders: digest runs whose messages found the stop are enqueued
again at the checker's next tick, and every newsletter that was sending gets its send chains now
(after the commit; the scheduler's reclaim would too, once their alive marks expire)."""

from __future__ import annotations

import logging
from typing import Any

from app.newsletter import kick
from app.newsletter import rows as newsletter_rows
from app.operations import audit
from app.platform import db, mail_stop
from digest import runs as digest_runs

log = logging.getLogger("app.operations.sending")

ACTION_STOP = "mail_stop.engage"
ACTION_RESUME = "mail_stop.release"
TARGET = "all outgoing mail"
MAX_REASON_CHARS = 500


def stop_sending(operator: audit.Operator, reason: str) -> dict[str, Any]:
    """Idempotent: a second stop keeps the first one's time and reason (and is audited as `already`)."""
    reason = reason.strip()[:MAX_REASON_CHARS]
    with db.raw_cursor() as cur:
        engaged = mail_stop.engage(cur, operator.label, reason)
        audit.record(cur, operator, ACTION_STOP, TARGET, {"reason": reason, "already": not engaged})
    if engaged:
        log.warning("EMERGENCY STOP engaged by %s: %s", operator.label, reason or "(no reason given)")
    return {"stopped": True, "already": not engaged, **(mail_stop.state() or {})}


def resume_sending(operator: audit.Operator) -> dict[str, Any]:
    """Nothing lost or sent twice: what was claimed went back to `pending` when the senders met the stop."""
    with db.raw_cursor() as cur:
        released = mail_stop.release(cur)
        restarted = newsletter_rows.sending_ids(cur)
        result = {
            "was_stopped": released is not None,
            "digest_runs_requeued": digest_runs.forget_enqueued(cur),
            "newsletters_restarted": restarted,
        }
        audit.record(cur, operator, ACTION_RESUME, TARGET, result)
    if released is not None:
        at, stopped_by, reason = released
        log.warning(
            "emergency stop released by %s (engaged %s by %s: %s)",
            operator.label,
            at.isoformat(),
            stopped_by,
            reason or "no reason given",
        )
    kick.restart_sending(restarted)
    return result
