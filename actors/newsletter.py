"""Newsletter actors (queue "newsletter"). Thin: the work is in app.newsletter.

Queues and priorities (names from actors/broker.py):
  digest                 mail a person expects at their hour. Digest actors run at default
                         priority; these actors at NEWSLETTER_PRIORITY (a larger number = lower
                         priority in Dramatiq), so when a worker holds messages from both queues
                         the digest goes first.
  newsletter             create_outbox and send_batch below. A send_batch message works for at
                         most a few seconds (sender.BUDGET_SECONDS) and re-enqueues itself, so a
                         million-recipient newsletter never holds a thread for long: it is a few
                         "send chains" (NEWSLETTER_SEND_CHAINS) cycling through the queue.
  For hard isolation run a dedicated worker: `dramatiq actors --queues newsletter` beside
  `dramatiq actors --queues digest webhooks`.

Messages are hints: the newsletter and email_log rows are the truth, every actor is idempotent,
and reclaim_stale (scheduler tick) re-kicks work whose messages were lost (a flushed Redis).
"""

from __future__ import annotations

import logging

from app.newsletter import messages, outbox, sender
from app.platform import holds, queue

log = logging.getLogger("actors.newsletter")

NEWSLETTER_PRIORITY = 100
_QUEUE_OPTIONS = {"priority": NEWSLETTER_PRIORITY, "min_backoff": 1_000, "max_backoff": 60_000}


@queue.actor(messages.CREATE_OUTBOX, **_QUEUE_OPTIONS, max_retries=10, time_limit=60 * 60_000)
def create_outbox(newsletter_id: int) -> None:
    """Build the outbox. Acked only after it returns: a worker killed mid-way leaves the message
    un-acked, Dramatiq redelivers it, and the re-run skips rows already written."""
    outbox.create_outbox(int(newsletter_id))


@queue.actor(
    messages.SEND_BATCH,
    **_QUEUE_OPTIONS,
    max_retries=20,
    time_limit=holds.SEND_ACTOR_TIME_LIMIT_MS,  # a batch may wait for Postgres with outcomes in hand
)
def send_batch(newsletter_id: int) -> None:
    stats = sender.send_batch(int(newsletter_id))
    if stats.claimed:
        log.info(
            "newsletter %s: claimed %d sent %d failed %d retry %d suppressed %d (%s)",
            newsletter_id,
            stats.claimed,
            stats.sent,
            stats.failed,
            stats.retry,
            stats.suppressed,
            stats.outcome,
        )
