"""The newsletter domain's messages (app/platform/queue.py): what actors/newsletter.py reads, by name."""

from __future__ import annotations

from app.platform.queue import Target

CREATE_OUTBOX = Target("newsletter", "create_outbox")
SEND_BATCH = Target("newsletter", "send_batch")
