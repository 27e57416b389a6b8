"""Actor on queue "webhooks": apply stored SendGrid events (tracking/webhook_apply.py does the work).

At-least-once delivery is fine: apply_events only touches rows still unprocessed, under a row lock.
"""

from __future__ import annotations

from app.platform import queue
from tracking import messages, webhook_apply


@queue.actor(messages.APPLY_WEBHOOK_EVENTS, max_retries=20, min_backoff=1_000, max_backoff=300_000, time_limit=120_000)
def apply_webhook_events(ids: list[int]) -> None:
    webhook_apply.apply_events(ids)
