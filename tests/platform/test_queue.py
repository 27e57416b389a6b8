"""Domains enqueue by actor name (app/platform/queue.py), each naming its messages in its own
`messages` module: every name must be a real actor on its queue."""

from __future__ import annotations

import actors  # noqa: F401  (binds every actor to the broker)
from app.newsletter import messages as newsletter_messages
from app.platform import queue
from digest import messages as digest_messages
from tracking import messages as tracking_messages

TARGETS = [
    value
    for module in (digest_messages, newsletter_messages, tracking_messages)
    for value in vars(module).values()
    if isinstance(value, queue.Target)
]


def test_every_target_is_an_actor_on_its_queue():
    broker = queue.broker()
    assert len(TARGETS) == 5
    for target in TARGETS:
        actor = broker.get_actor(target.actor)
        assert actor.queue_name == target.queue, target
        assert target.queue in queue.QUEUES
    # ...and every queue operators are told about has work on it (no queue that nothing uses).
    assert {target.queue for target in TARGETS} == set(queue.QUEUES)


def test_send_puts_a_message_the_actor_can_read(redis_client):
    queue.broker().flush_all()
    queue.send(newsletter_messages.SEND_BATCH, 42)
    assert queue.depth("newsletter") == 1
    queue.send(newsletter_messages.SEND_BATCH, 42, delay_ms=60_000)
    assert queue.depth("newsletter") == 2
    queue.broker().flush_all()
