"""The emergency stop from the dashboard (app/platform/mail_stop.py): engage or release it, each with its
audit row (admin_audit: which API key, when, from where, why)."""

from __future__ import annotations

import json

from app.newsletter import kick
from app.platform import db, mail_stop
from digest import plan

ACTION_STOP = "mail_stop.engage"
ACTION_RESUME = "mail_stop.release"
MAX_REASON_CHARS = 500


def _audit(key_id: int, key_name: str, action: str, detail: dict, ip: str | None) -> None:
    db.query(
        "INSERT INTO admin_audit (api_key_id, api_key_name, action, target, detail, ip) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (key_id, key_name, action, "all outgoing mail", json.dumps(detail), ip),
    )


def stop(key_id: int, key_name: str, ip: str | None, reason: str, session_id: int | None) -> dict:
    result = mail_stop.engage(f"admin:{key_name}", reason)
    _audit(
        key_id, key_name, ACTION_STOP, {"reason": reason, "already": result["already"], "session_id": session_id}, ip
    )
    return result


def resume(key_id: int, key_name: str, ip: str | None, session_id: int | None) -> dict:
    was_stopped = mail_stop.release(f"admin:{key_name}")
    result = {
        "was_stopped": was_stopped,
        "digest_runs_requeued": plan.forget_enqueued(),
        "newsletters_restarted": kick.restart_sending(),
    }
    _audit(key_id, key_name, ACTION_RESUME, {**result, "session_id": session_id}, ip)
    return result
