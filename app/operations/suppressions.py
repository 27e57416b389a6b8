"""An operator adds an address to the suppression list or removes one (the dashboard), each in one
transaction with its audit row (which API key, when, from where, which address, the operator's note).

Added: the address in its canonical form (README "Address identity"), reason 'manual' — no mail
goes to it from the next claim on; one suppressed already keeps its reason (the audit says so).
Removed: mail may reach it again from the next claim on; that address's soft-bounce count is reset
(so a deferral right after does not suppress it again at once), and the audit row keeps the
suppression's reason, source and age."""

from __future__ import annotations

from app.operations import audit
from app.platform import db
from app.platform.addresses import AddressError, canonical, check_domain, sendable
from app.platform.errors import Invalid
from app.subscribers import records, suppressions

ACTION_ADD = "suppression.add"
ACTION_REMOVE = "suppression.remove"


def add_suppression(operator: audit.Operator, address: str, note: str) -> tuple[suppressions.Suppression, bool]:
    """(the suppression of the address, whether this added it). Invalid naming `email` for an
    address that is not one."""
    try:
        sendable(address)
        check_domain(address)
    except AddressError:
        raise Invalid("email", "must be a valid email address") from None
    key = canonical(address)
    with db.raw_cursor() as cur:
        added = suppressions.suppress(cur, key, "manual", f"operator {operator.label}")
        row = suppressions.find(cur, key)
        assert row is not None  # added, or there already
        audit.record(cur, operator, ACTION_ADD, key, {"note": note, "already": not added, "reason": row.reason})
    return row, added


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
