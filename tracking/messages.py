"""The tracking domain's messages (app/platform/queue.py): what actors/webhooks.py reads, by name."""

from __future__ import annotations

from app.platform.queue import Target

APPLY_WEBHOOK_EVENTS = Target("webhooks", "apply_webhook_events")
