"""Enqueue helpers. Messages are hints (Postgres is the truth), so every kick is safe to repeat.

Messages are addressed by actor name (app/platform/queue.py): this module never imports the actors.
"""

from __future__ import annotations

import logging

import redis as redis_lib

from app.newsletter import messages
from app.platform import config, queue

log = logging.getLogger("app.newsletter.kick")

ALIVE_TTL_SECONDS = 120
_redis = None
_redis_url = None


def redis_client():
    global _redis, _redis_url
    url = config.get().redis_url
    if _redis is None or _redis_url != url:
        _redis, _redis_url = redis_lib.Redis.from_url(url), url
    return _redis


def alive_key(newsletter_id: int) -> str:
    return f"notify:newsletter:{newsletter_id}:alive"


def mark_alive(newsletter_id: int, ttl: float = ALIVE_TTL_SECONDS) -> None:
    """Send chains exist for this newsletter; reclaim_stale re-kicks only when this has expired
    (e.g. Redis was flushed and took the messages with it)."""
    try:
        redis_client().set(alive_key(newsletter_id), b"1", ex=max(1, int(ttl)))
    except redis_lib.RedisError as exc:  # a hint only: the next tick re-kicks if needed
        log.warning("could not mark newsletter %s alive: %s", newsletter_id, exc)


def clear_alive(newsletter_id: int) -> None:
    """The chains stopped with rows left for later (a local time, a long backoff): the next tick
    whose reclaim finds one of them due kicks chains at once, not after the mark's TTL."""
    try:
        redis_client().delete(alive_key(newsletter_id))
    except redis_lib.RedisError as exc:  # then the mark just expires
        log.warning("could not clear newsletter %s's alive mark: %s", newsletter_id, exc)


def is_alive(newsletter_id: int) -> bool:
    return bool(redis_client().exists(alive_key(newsletter_id)))


def outbox(newsletter_id: int) -> None:
    queue.send(messages.CREATE_OUTBOX, newsletter_id)


def send_chains(newsletter_id: int, count: int | None = None, delay_ms: int | None = None) -> None:
    count = count or config.get().newsletter_send_chains
    for _ in range(max(1, count)):
        queue.send(messages.SEND_BATCH, newsletter_id, delay_ms=delay_ms)
    mark_alive(newsletter_id)
    log.info("newsletter %s: %d send chain(s) enqueued", newsletter_id, count)


def continue_chain(newsletter_id: int, delay_ms: int = 0) -> None:
    queue.send(messages.SEND_BATCH, newsletter_id, delay_ms=delay_ms)


def restart_sending(newsletter_ids: list[int]) -> None:
    """After the emergency stop is released: send chains for these newsletters (they were `sending`:
    their chains ended when they met the stop). Extra chains only claim rows nobody holds."""
    for newsletter_id in newsletter_ids:
        try:
            send_chains(newsletter_id)
        except Exception as exc:  # the row is the truth: the scheduler's reclaim re-kicks
            log.error("newsletter %s: could not restart its send chains (%s); the next tick will", newsletter_id, exc)
