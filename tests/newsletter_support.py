"""Helpers shared by the newsletter tests (seeding, driving the send loop in process)."""
from __future__ import annotations

import time

from app import db
from app.newsletter import outbox, sender, service

HTML = ('<html><head><style>p { color: #333; }</style></head><body>'
        '<p>Hello {{name}},</p><p>News for {{email}} ({{user_id}}).</p>'
        '<a href="https://example.com/article?id=1&amp;x=2">Read</a> '
        '<a href="{{preferences_url}}">Preferences</a> <a href="{{unsubscribe_url}}">Unsubscribe</a>'
        '</body></html>')


def seed_subscribers(n: int, start: int = 1) -> None:
    db.query(
        "INSERT INTO subscribers (user_id, email, name) "
        "SELECT 'u' || g, 'user' || g || '@example.com', 'User ' || g FROM generate_series(%s, %s) g",
        (start, start + n - 1))


def make_newsletter(subject: str = "Hi {{name}}", html: str = HTML, text: str | None = None) -> int:
    values, errors = service.validate_new({"subject": subject, "html": html, **({"text": text} if text else {})})
    assert not errors, errors
    return service.create(values)


def start(newsletter_id: int, audience=None) -> None:
    """Request the send and build the outbox in process (what the create_outbox actor does)."""
    service.request_send(newsletter_id, audience or {"kind": "all"})
    outbox.create_outbox(newsletter_id)


def drain(newsletter_id: int, provider, max_rounds: int = 1000, max_wait: float = 10.0) -> list[dict]:
    """Run the send loop in process until it would stop, sleeping where the actor would re-enqueue
    itself with a delay (throttle, backoff) — this stands in for Dramatiq's delayed message."""
    rounds = []
    for _ in range(max_rounds):
        stats = sender.send_batch(newsletter_id, provider=provider, reenqueue=False, budget_seconds=60)
        rounds.append(stats)
        if stats["retry_in"] is None:
            break
        time.sleep(min(max_wait, stats["retry_in"]))
    return rounds


def counts(newsletter_id: int) -> dict:
    return dict(db.query("SELECT status, count(*) FROM email_log WHERE newsletter_id = %s GROUP BY status",
                         (newsletter_id,)))


def newsletter_status(newsletter_id: int) -> str:
    return db.query("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))[0][0]
