"""Handing work to Dramatiq: the Redis broker, and enqueueing by actor name.

Domains enqueue with send(TARGET, …) and never import the actors: each domain names its messages
in its own `messages` module (digest/messages.py, app/newsletter/messages.py, tracking/messages.py)
and the actors take their names and queues from there, so imports point one way (platform ←
domains ← actors) and this module knows no message; tests/platform/test_queue.py checks every target is an
actor on its queue. Messages are hints — the rows
in Postgres are the truth — so every enqueue is safe to repeat and safe to lose.

Queues (each worker process consumes all of them; run a dedicated worker with `--queues digest
webhooks` if a big newsletter must never share threads with digests; actors/newsletter.py says how
newsletter messages yield to digests within one worker):
  digest         build_and_send_digest, send_now
  newsletter     outbox creation and send batches
  webhooks       applying stored SendGrid events
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import dramatiq
from dramatiq.actor import ActorDecorator
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import AgeLimit, Callbacks, Middleware, Pipelines, Retries, ShutdownNotifications, TimeLimit

from app.platform import config

QUEUES = ("digest", "newsletter", "webhooks")


class Target(NamedTuple):
    """A message's queue and the name of the actor that reads it."""

    queue: str
    actor: str


def actor(target: Target, **options: Any) -> ActorDecorator:
    """dramatiq.actor declaring the actor that reads `target`: its name and queue come from there."""
    return dramatiq.actor(actor_name=target.actor, queue_name=target.queue, **options)


_lock = threading.Lock()
_broker: RedisBroker | None = None


def make_broker(
    url: str | None = None, namespace: str = "dramatiq", extra_middleware: Sequence[Middleware] = ()
) -> RedisBroker:
    middleware = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(),
        *extra_middleware,
    ]
    return RedisBroker(url=url or config.get().redis_url, namespace=namespace, middleware=middleware)


def _set(new: RedisBroker) -> RedisBroker:
    global _broker
    _broker = new
    dramatiq.set_broker(new)
    return new


def install(new: RedisBroker) -> RedisBroker:
    """Make `new` the process's broker (Dramatiq's global one, which actors bind to)."""
    with _lock:
        return _set(new)


def broker() -> RedisBroker:
    """The process's broker; a process that only enqueues (web, scheduler) gets one on first use."""
    if _broker is None:
        with _lock:
            if _broker is None:
                _set(make_broker())
    assert _broker is not None  # set above, never unset but by _set
    return _broker


def send(target: Target, *args: Any, delay_ms: int | None = None) -> None:
    message: dramatiq.Message[None] = dramatiq.Message(
        queue_name=target.queue, actor_name=target.actor, args=args, kwargs={}, options={}
    )
    broker().enqueue(message, delay=int(delay_ms) if delay_ms else None)


def depth(queue_name: str) -> int:
    """Messages waiting in Redis for this queue (ready + delayed)."""
    b = broker()
    return int(b.client.llen(f"{b.namespace}:{queue_name}")) + int(b.client.llen(f"{b.namespace}:{queue_name}.DQ"))
