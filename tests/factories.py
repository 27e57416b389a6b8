"""The one place tests make rows: subscribers, events, digest runs, newsletters, outbox rows and
suppressions. Each builder has defaults a test can override by keyword, and returns the new id(s).

conftest.clean_db needs nothing from here: it finds the tables to truncate by their rows and moved
id sequences, which every insert below leaves behind.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import psycopg2.extras

from app.newsletter import service
from app.platform import db
from app.platform.addresses import canonical
from app.subscribers import records as subscribers

HTML = (
    "<html><head><style>p { color: #333; }</style></head><body>"
    "<p>Hello {{name}},</p><p>News for {{email}} ({{user_id}}).</p>"
    '<a href="https://example.com/article?id=1&amp;x=2">Read</a> '
    '<a href="{{preferences_url}}">Preferences</a> <a href="{{unsubscribe_url}}">Unsubscribe</a>'
    "</body></html>"
)

_producer_ids = itertools.count(1)


def insert(table: str, **values) -> int:
    """One plain INSERT of exactly these columns (the rest take their defaults); its id."""
    cols = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    ((row_id,),) = db.query(f"INSERT INTO {table} ({cols}) VALUES ({marks}) RETURNING id", list(values.values()))
    return row_id


# ---------------------------------------------------------------- subscribers


def subscriber(user_id: str = "u1", email: str | None = None, **values) -> int:
    """A subscriber as the API stores it (create or replace by user_id): the app's defaults, name
    'Ana Lima', address <user_id>@example.test, then `values`. With id=… a plain INSERT instead."""
    data = {**subscribers.DEFAULTS, "name": "Ana Lima", "email": email or f"{user_id}@example.test", **values}
    if "id" in data:  # the app never picks an id itself
        return insert("subscribers", user_id=user_id, canonical_email=canonical(data["email"]), **data)
    record, _ = subscribers.upsert(user_id, data)
    return record["id"]


def seed_subscribers(n: int, start: int = 1) -> None:
    """n subscribers in one statement: ids start…, user_id 'u<i>', 'user<i>@example.com', 'User <i>'
    (ids equal i on a fresh table)."""
    db.query(
        "INSERT INTO subscribers (user_id, email, name) "
        "SELECT 'u' || g, 'user' || g || '@example.com', 'User ' || g FROM generate_series(%s, %s) g",
        (start, start + n - 1),
    )


# ---------------------------------------------------------------- digest events and runs


def events(
    user_id: str,
    n: int = 1,
    category: str = "like",
    entity_type: str = "post",
    entity_id: str = "p1",
    actor: str | None = None,
    payload: dict | None = None,
    when: datetime | None = None,
    actor_name: str | None = None,
    run_id: int | None = None,
) -> list[int]:
    """n events for user_id, one statement; actor None gives distinct actors a0, a1, … named
    'Actor a<i>'; they occurred one second apart, the last a second before `when` (now). Their ids."""
    when = when or datetime.now(UTC)
    body = json.dumps(payload or {"title": f"Post {entity_id}"})
    rows = []
    for i in range(n):
        actor_id = actor if actor is not None else f"a{i}"
        rows.append(
            (
                "test",
                f"ev-{next(_producer_ids)}",
                user_id,
                category,
                entity_type,
                entity_id,
                actor_id,
                actor_name or f"Actor {actor_id}",
                body,
                when - timedelta(seconds=n - i),
                run_id,
            )
        )
    with db.raw_cursor() as cur:
        returned = psycopg2.extras.execute_values(
            cur,
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
            "actor_id, actor_name, payload, occurred_at, digest_run_id) VALUES %s RETURNING id",
            rows,
            page_size=max(n, 1),
            fetch=True,
        )
    return [row_id for (row_id,) in returned]


def category_events(user_id: str, *categories: str, run_id: int | None = None) -> list[int]:
    """One event per category, on posts '0', '1', … (the topics the preference pages list)."""
    return [
        events(user_id, category=category, entity_id=str(i), run_id=run_id)[0] for i, category in enumerate(categories)
    ]


def digest_run(
    subscriber_id: int,
    cadence: str = "daily",
    period=None,
    scheduled_for: datetime | None = None,
    status: str = "pending",
    **columns,
) -> int:
    """A digest run due a minute ago (period: that UTC date); other columns (claimed_at, …) by keyword."""
    scheduled_for = scheduled_for or datetime.now(UTC) - timedelta(minutes=1)
    return insert(
        "digest_runs",
        subscriber_id=subscriber_id,
        cadence=cadence,
        period=period or scheduled_for.date(),
        scheduled_for=scheduled_for,
        status=status,
        **columns,
    )


# ---------------------------------------------------------------- newsletters, outbox, suppressions


def newsletter(subject: str = "Hi {{name}}", html: str = HTML, text: str | None = None) -> int:
    """A draft newsletter as the API creates it (validated template)."""
    values, errors = service.validate_new({"subject": subject, "html": html, **({"text": text} if text else {})})
    assert not errors, errors
    return service.create(values)


def newsletter_row(subject: str = "s", html: str = "<p>x</p>", **columns) -> int:
    """A newsletters row written directly (any status, a fixed id, …), no template checks."""
    return insert("newsletters", subject=subject, html=html, **columns)


def outbox_row(
    newsletter_id: int, subscriber_id: int, email: str | None = None, status: str = "sent", **columns
) -> int:
    """The newsletter's email_log row for a subscriber; email None: their address now."""
    if email is None:
        ((email,),) = db.query("SELECT email FROM subscribers WHERE id = %s", (subscriber_id,))
    return insert(
        "email_log", newsletter_id=newsletter_id, subscriber_id=subscriber_id, email=email, status=status, **columns
    )


def suppression(email: str, reason: str = "bounce", **columns) -> int:
    """A suppressed address (stored as given: the app stores them in canonical form, app/platform/addresses.py)."""
    return insert("suppressions", email=email, reason=reason, **columns)
