"""A subscriber stops or restarts what a signed link's scope names (app/subscribers/streams.py): from
the unsubscribe page, RFC 8058 one-click, or the preference centre. Keyed on (id, token_version), so
a token revoked between page load and submit changes nothing."""

from __future__ import annotations

from app.platform import db
from app.subscribers import records, streams
from digest import runs as digest_runs


def unsubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    """Idempotent. False: the token was revoked meanwhile (nothing changed)."""
    target = streams.target(scope)
    with db.raw_cursor() as cur:
        if not records.stop(cur, subscriber_id, token_version, target):
            return False
        if target.kind == streams.EVERYTHING:
            # Claims check unsubscribed_at anyway; cancelling queued runs now also keeps the
            # operator's view honest (a run will not show as pending for someone who left). A
            # stopped digest stream needs nothing here: the schedule trigger (migration 0004)
            # cancels the pending runs, and claims skip any other ("cadence changed").
            digest_runs.cancel_pending(cur, subscriber_id, "unsubscribed")
        return True


def resubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    """Undoes unsubscribe() for the same scope. False: the token was revoked meanwhile."""
    with db.raw_cursor() as cur:
        return records.restart(cur, subscriber_id, token_version, streams.target(scope))
