"""The naive baseline's worker module for scripts/bench/newsletter.py: ONE Dramatiq task per
recipient, ONE provider call per recipient (what a first version usually does). Loaded into the
benchmark's worker with `dramatiq actors scripts.bench.newsletter_naive`; never used in production.
"""

from __future__ import annotations

import dramatiq

import actors  # noqa: F401  (sets up the broker before the actor below binds to it)
from app.newsletter import rows, sender
from app.platform import db

CLAIM_ONE = rows.CLAIM.replace("ORDER BY e.id", "AND e.id = %(row)s")


@dramatiq.actor(queue_name="newsletter", max_retries=0)
def naive_send_one(newsletter_id: int, row_id: int) -> None:
    from app.platform.providers import get_provider

    subject, html, text, from_addr = db.thread_connection.run(
        "SELECT subject, html, text, from_addr FROM newsletters WHERE id = %s", (newsletter_id,)
    )[0]
    renderer = sender.Renderer.load(newsletter_id, subject, html, text, from_addr)
    claimed = db.thread_connection.run(CLAIM_ONE, {"nl": newsletter_id, "limit": 1, "row": row_id, "after": 0})
    if not claimed:
        return
    row = rows.Claimed(*claimed[0])
    if row.status != "sending":
        return
    result = get_provider().send_batch([renderer.render(row)])[0]
    status = "sent" if result.ok else "failed"
    db.thread_connection.call(rows.mark, [rows.Mark(row.id, status, result.message_id, result.error, None, 0)])


def enqueue(newsletter_id: int) -> int:
    """One message per outbox row (the naive fan-out)."""
    ids = [r[0] for r in db.query("SELECT id FROM email_log WHERE newsletter_id = %s ORDER BY id", (newsletter_id,))]
    for row_id in ids:
        naive_send_one.send(newsletter_id, row_id)
    return len(ids)
