"""Dramatiq broker set-up. Sentry first, then the broker, then (in actors/__init__) the actors.

Queues, highest priority first (each worker process consumes all of them; run a dedicated worker
with `--queues transactional digest` if a big newsletter must never share threads with digests):
  transactional  one-off mail a user is waiting for
  digest         build_and_send_digest
  newsletter     outbox creation and send batches
  webhooks       applying stored SendGrid events
"""
from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, ShutdownNotifications, TimeLimit

from app import config, db, observability

QUEUES = ("transactional", "digest", "newsletter", "webhooks")


def make_broker(url: str | None = None, namespace: str = "dramatiq") -> RedisBroker:
    middleware = [AgeLimit(), TimeLimit(), ShutdownNotifications(), Callbacks(), Pipelines(), Retries()]
    return RedisBroker(url=url or config.get().redis_url, namespace=namespace, middleware=middleware)


def setup(url: str | None = None) -> RedisBroker:
    observability.setup_logging()
    observability.init_sentry("worker")
    db.init()
    broker = make_broker(url)
    dramatiq.set_broker(broker)
    return broker
