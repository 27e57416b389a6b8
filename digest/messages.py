"""The digest domain's messages (app/platform/queue.py): what actors/digest.py reads, by name."""

from __future__ import annotations

from app.platform.queue import Target

DIGEST_BATCH = Target("digest", "build_and_send_digest")  # run ids the checker found due
SEND_NOW = Target("digest", "send_now")  # an ingest commit asked for a send-now pass
