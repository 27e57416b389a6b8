"""The naive baseline's worker module for scripts/bench/newsletter.py: ONE Dramatiq task per
recipient, ONE provider call per recipient (what a first version usually does). Loaded into the
benchmark's worker with `dramatiq actors scripts.bench.newsletter_naive`; never used in production.
"""

from __future__ import annotations

import dramatiq

import actors  # noqa: F401  (sets up the broker before the actor below binds to it)
from app.newsletter import rows, sender, template
from app.platform import config, db

CLAIM_ONE = rows.CLAIM.replace("ORDER BY e.id", "AND e.id = %(row)s")


@dramatiq.actor(queue_name="newsletter", max_retries=0)
def naive_send_one(newsletter_id: int, row_id: int) -> None:
    from app.platform.providers import get_provider
    from tracking.links import LinkRewriter

    settings = config.get()
    subject, html, text, from_addr = db.thread_connection.run(
        "SELECT subject, html, text, from_addr FROM newsletters WHERE id = %s", (newsletter_id,)
    )[0]
    compiled = template.compiled_for(newsletter_id, subject, html, text)
    claimed = db.thread_connection.run(CLAIM_ONE, {"nl": newsletter_id, "limit": 1, "row": row_id, "after": 0})
    if not claimed:
        return
    row_id, status, _attempts, sub_id, email, name, user_id, token_version, opt_out = claimed[0]
    if status != "sending":
        return
    mail = sender._render(
        newsletter_id,
        row_id,
        sub_id,
        email,
        name,
        user_id,
        token_version,
        opt_out,
        compiled,
        LinkRewriter("newsletter", newsletter_id),
        from_addr,
        settings,
    )
    result = get_provider().send_batch([mail])[0]
    db.thread_connection.execute_values(
        rows.MARK,
        [(row_id, "sent" if result.ok else "failed", result.message_id, result.error, None, 0)],
        rows.MARK_TEMPLATE,
    )


def enqueue(newsletter_id: int) -> int:
    """One message per outbox row (the naive fan-out)."""
    ids = [r[0] for r in db.query("SELECT id FROM email_log WHERE newsletter_id = %s ORDER BY id", (newsletter_id,))]
    for row_id in ids:
        naive_send_one.send(newsletter_id, row_id)
    return len(ids)
