"""The subscriber behind a page: the topics shown, their stops and restarts (sync; endpoints call
them in a thread).

The row (records.load_by_id) and the writes are app/subscribers/records.py's (the one writer of
`subscribers`); unsubscribe and resubscribe are app/operations/opt_out.py's. Both are keyed on (id,
token_version), so a token revoked between page load and submit changes nothing; preference saves
go through subscribers.update().
"""

from __future__ import annotations

from app.platform import db
from app.subscribers import categories, records, streams

# How many topic checkboxes the preference centre shows at most; opt-outs are always shown.
MAX_SHOWN_CATEGORIES = records.MAX_CATEGORIES

# Topics this subscriber has events in (within retention): the feed summary (migration 0680) holds
# one row per entity and category of theirs. A category the subscriber opted out of stays via opt-outs.
_CATEGORIES_SQL = """
    SELECT DISTINCT category FROM feed_entities WHERE user_id = %s ORDER BY category LIMIT %s
"""


def shown_categories(subscriber: dict) -> list[str]:
    """Sorted topics to show: current opt-outs, registered categories (app/subscribers/categories.py) and the
    subscriber's event categories, capped in that order of precedence."""
    opt_outs = subscriber["category_opt_outs"]
    rows = db.query(_CATEGORIES_SQL, (subscriber["user_id"], MAX_SHOWN_CATEGORIES))
    seen = set(opt_outs)
    candidates = [*sorted(categories.registry()), *(r[0] for r in rows)]
    extra = [c for c in dict.fromkeys(candidates) if c not in seen][: max(0, MAX_SHOWN_CATEGORIES - len(opt_outs))]
    return sorted(seen.union(extra))


def topics(keys: list[str]) -> list[dict]:
    """Each category key with the label and description it is shown with, ordered by label."""
    registry = categories.registry()
    shown = [categories.lookup(key, registry) for key in keys]
    return [
        {"key": c.key, "label": c.label, "description": c.description}
        for c in sorted(shown, key=lambda c: (c.label.casefold(), c.key))
    ]


def save_preferences(subscriber_id: int, values: dict) -> None:
    """Validated values (plus paused_until) in one transaction; cancels runs of a dropped cadence."""
    records.update(subscriber_id, values)


def set_paused_until(subscriber_id: int, token_version: int, until) -> None:
    records.set_paused_until(subscriber_id, token_version, until)


def is_stopped(subscriber: dict, target: streams.Target) -> bool:
    """Whether what `target` names is already stopped for this subscriber (page state)."""
    if target.kind == streams.CATEGORY:
        return target.category in subscriber["category_opt_outs"]
    if target.kind == streams.DIGESTS:
        return subscriber["digest_cadence"] == "off"
    if target.kind == streams.NEWSLETTERS:
        return subscriber["newsletters_unsubscribed_at"] is not None
    return subscriber["unsubscribed_at"] is not None


def scope_category(scope: str | None) -> str | None:
    return streams.target(scope).category
