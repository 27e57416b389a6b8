"""Domains enqueue by actor name (app/queue.py): every name must be a real actor on its queue."""
from __future__ import annotations

import actors  # noqa: F401  (binds every actor to the broker)
from app import queue


def test_every_target_is_an_actor_on_its_queue():
    broker = queue.broker()
    for target in queue.TARGETS:
        actor = broker.get_actor(target.actor)
        assert actor.queue_name == target.queue, target
        assert target.queue in queue.QUEUES


def test_send_puts_a_message_the_actor_can_read(redis_client):
    queue.broker().flush_all()
    queue.send(queue.SEND_BATCH, 42)
    assert queue.depth("newsletter") == 1
    queue.send(queue.SEND_BATCH, 42, delay_ms=60_000)
    assert queue.depth("newsletter") == 2
    queue.broker().flush_all()
