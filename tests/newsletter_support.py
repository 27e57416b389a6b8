"""Helpers shared by the newsletter tests: driving the send loop in process (rows: tests/factories.py)."""

from __future__ import annotations

import time

from app.newsletter import outbox, sender, service
from app.platform import db


def start(newsletter_id: int, audience=None) -> None:
    """Request the send and build the outbox in process (what the create_outbox actor does)."""
    service.request_send(newsletter_id, audience or {"kind": "all"})
    outbox.create_outbox(newsletter_id)


def drain(newsletter_id: int, provider, max_rounds: int = 1000, max_wait: float = 10.0) -> list[sender.SendStats]:
    """Run the send loop in process until it would stop, sleeping where the actor would re-enqueue
    itself with a delay (throttle, backoff) — this stands in for Dramatiq's delayed message."""
    rounds = []
    for _ in range(max_rounds):
        stats = sender.send_batch(newsletter_id, provider=provider, reenqueue=False, budget_seconds=60)
        rounds.append(stats)
        if stats.retry_in is None:
            break
        time.sleep(min(max_wait, stats.retry_in))
    return rounds


def counts(newsletter_id: int) -> dict:
    return dict(
        db.query("SELECT status, count(*) FROM email_log WHERE newsletter_id = %s GROUP BY status", (newsletter_id,))
    )


def newsletter_status(newsletter_id: int) -> str:
    return db.query("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))[0][0]
