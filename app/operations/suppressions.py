"""An operator removes an address from the suppression list (the dashboard): mail may reach it again
from the next claim on. One transaction: the row deleted, that address's soft-bounce count reset (so
a deferral right after does not suppress it again at once), and the audit row (which API key, when,
from where, which address, the suppression's reason, source and age, and the operator's note)."""

from __future__ import annotations

from app.operations import audit
from app.platform import db
from app.subscribers import records, suppressions

ACTION_REMOVE = "suppression.remove"


def remove_suppression(operator: audit.Operator, suppression_id: int, note: str) -> suppressions.Suppression | None:
    """The row removed; None when there is no such row (already removed)."""
    with db.raw_cursor() as cur:
        removed = suppressions.remove(cur, suppression_id)
        if removed is None:
            return None
        records.reset_soft_bounces(cur, None, removed.email)
        detail = {
            "suppression_id": removed.id,
            "reason": removed.reason,
            "source": removed.source,
            "suppressed_at": removed.created_at.isoformat(),
            "note": note,
        }
        audit.record(cur, operator, ACTION_REMOVE, removed.email, detail)
    return removed
