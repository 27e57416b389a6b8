"""build_and_send_digest: the digest queue's only actor. Thin: the work is digest.send.process.

A message names a batch of run ids the scheduler's checker found due; a message without ids claims
whatever is due. The message is only a hint — the runs' rows decide: a run someone else already
claimed or sent is skipped by the claim query (FOR UPDATE SKIP LOCKED), so duplicates and
redeliveries are harmless. Send failures are retried through the row (backoff in next_attempt_at,
re-enqueued by the checker), not by Dramatiq; Dramatiq retries only cover crashes before the claim.
"""

from __future__ import annotations

from datetime import UTC, datetime

import dramatiq
from dramatiq.middleware import Middleware

from app.platform import holds, providers, queue
from digest import immediate, messages
from digest import render as digest_render
from digest import send as digest_send

MAX_IDS_PER_MESSAGE = 1000


class DigestTemplateWarmup(Middleware):
    """Compile the digest templates (premailer, once per process) when a worker boots, not on its
    first message; processes that only enqueue (scheduler, web) never pay for it. Close pooled
    provider connections once the worker has stopped.

    After, not before: Dramatiq emits worker_shutdown BEFORE it joins the worker threads, so closing
    providers there cut off the batches still being sent on SIGTERM (a deploy), and their rows were
    sent again later. after_worker_shutdown runs once every in-flight message has finished."""

    def after_worker_boot(self, broker, worker):
        digest_render.warm_up_in_background()

    def after_worker_shutdown(self, broker, worker):
        providers.close_all()  # QUIT pooled SMTP connections instead of dropping them


_broker = dramatiq.get_broker()
if not any(isinstance(m, DigestTemplateWarmup) for m in _broker.middleware):
    _broker.add_middleware(DigestTemplateWarmup())


_BATCH_OPTIONS = {
    "max_retries": 3,
    "min_backoff": 1_000,
    "max_backoff": 60_000,
    "time_limit": holds.SEND_ACTOR_TIME_LIMIT_MS,  # a batch may wait for Postgres with outcomes in hand
}


@queue.actor(messages.DIGEST_BATCH, **_BATCH_OPTIONS)
def build_and_send_digest(run_ids: list[int] | None = None) -> None:
    if run_ids is not None:
        if not isinstance(run_ids, list) or len(run_ids) > MAX_IDS_PER_MESSAGE:
            raise ValueError(f"run_ids must be a list of at most {MAX_IDS_PER_MESSAGE} ids")
        run_ids = [int(i) for i in run_ids]
    digest_send.process(run_ids=run_ids)


# A hint sent after an ingest commit that asked for it (digest/ingest.py): one send-now pass, then
# the runs it made due now are sent here. Losing it only delays them to the scheduler's next tick.
@queue.actor(messages.SEND_NOW, **_BATCH_OPTIONS)  # sends the same batches: the same limits
def send_now() -> None:
    _, run_ids = immediate.plan(datetime.now(UTC), sending_now=True)
    for start in range(0, len(run_ids), MAX_IDS_PER_MESSAGE):
        digest_send.process(run_ids=run_ids[start : start + MAX_IDS_PER_MESSAGE])
