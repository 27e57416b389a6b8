"""Database reads and writes behind the subscriber pages (sync; endpoints call them in a thread).

Unsubscribe/resubscribe/resume writes are keyed on (id, token_version), so a token revoked between
page load and submit changes nothing there; preference saves go through subscribers.update().
"""

from __future__ import annotations

from app.platform import db
from app.subscribers import categories as category_registry
from app.subscribers import records as subscribers
from app.subscribers import streams
from digest import runs as digest_runs

# How many topic checkboxes the preference centre shows at most; opt-outs are always shown.
MAX_SHOWN_CATEGORIES = subscribers.MAX_CATEGORIES

_COLUMNS = (
    "id",
    "user_id",
    "email",
    "name",
    "timezone",
    "digest_cadence",
    "digest_hour",
    "digest_weekday",
    "category_opt_outs",
    "paused_until",
    "unsubscribed_at",
    "token_version",
    "newsletters_unsubscribed_at",
    "digest_cadence_before_off",
)


def load(subscriber_id: int) -> dict | None:
    rows = db.query(f"SELECT {', '.join(_COLUMNS)} FROM subscribers WHERE id = %s", (subscriber_id,))
    if not rows:
        return None
    record = dict(zip(_COLUMNS, rows[0]))
    record["category_opt_outs"] = list(record["category_opt_outs"] or [])
    return record


# Topics this subscriber has ever had events in. Both halves use existing indexes: the partial
# "unsent" index on (user_id, id), and runs by subscriber -> events by digest_run_id. Sent events
# older than the run window drop out; a category the subscriber opted out of stays via opt-outs.
_CATEGORIES_SQL = """
    SELECT category FROM (
        SELECT DISTINCT category FROM digest_events WHERE user_id = %s AND digest_run_id IS NULL
        UNION
        SELECT DISTINCT e.category
          FROM digest_runs r JOIN digest_events e ON e.digest_run_id = r.id
         WHERE r.subscriber_id = %s AND r.created_at > now() - interval '180 days'
    ) c ORDER BY category LIMIT %s
"""


def categories(subscriber: dict) -> list[str]:
    """Sorted topics to show: current opt-outs, registered categories (app/subscribers/categories.py) and the
    subscriber's event categories, capped in that order of precedence."""
    opt_outs = subscriber["category_opt_outs"]
    rows = db.query(_CATEGORIES_SQL, (subscriber["user_id"], subscriber["id"], MAX_SHOWN_CATEGORIES))
    seen = set(opt_outs)
    candidates = [*sorted(category_registry.registry()), *(r[0] for r in rows)]
    extra = [c for c in dict.fromkeys(candidates) if c not in seen][: max(0, MAX_SHOWN_CATEGORIES - len(opt_outs))]
    return sorted(seen.union(extra))


def topics(keys: list[str]) -> list[dict]:
    """Each category key with the label and description it is shown with, ordered by label."""
    registry = category_registry.registry()
    shown = [category_registry.lookup(key, registry) for key in keys]
    return [
        {"key": c.key, "label": c.label, "description": c.description}
        for c in sorted(shown, key=lambda c: (c.label.casefold(), c.key))
    ]


def save_preferences(subscriber_id: int, values: dict) -> None:
    """Validated values (plus paused_until) in one transaction; cancels runs of a dropped cadence."""
    subscribers.update(subscriber_id, values)


def set_paused_until(subscriber_id: int, token_version: int, until) -> None:
    db.query(
        "UPDATE subscribers SET paused_until = %s, updated_at = now() WHERE id = %s AND token_version = %s",
        (until, subscriber_id, token_version),
    )


def unsubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    """Idempotent; stops what the token scope names (app/subscribers/streams.py). Returns whether the row
    matched (False = token revoked meanwhile)."""
    target = streams.target(scope)
    if target.kind == streams.CATEGORY:
        return _update(_OPT_OUT_SQL, (target.category, subscriber_id, token_version))
    if target.kind == streams.DIGESTS:
        # The schedule trigger (migration 0004) cancels the pending runs; claims skip any other
        # ("cadence changed").
        return _update(_DIGESTS_OFF_SQL, (subscriber_id, token_version))
    if target.kind == streams.NEWSLETTERS:
        return _update(_NEWSLETTERS_OFF_SQL, (subscriber_id, token_version))
    with db.database.connection_context(), db.database.atomic():
        # COALESCE keeps the first unsubscribe time when a client repeats the one-click POST.
        cur = db.database.execute_sql(
            "UPDATE subscribers SET unsubscribed_at = COALESCE(unsubscribed_at, now()), updated_at = now() "
            "WHERE id = %s AND token_version = %s",
            (subscriber_id, token_version),
        )
        if cur.rowcount == 0:
            return False
        # Claims check unsubscribed_at anyway; cancelling queued runs now also keeps the operator's
        # view honest (a run will not show as pending for someone who left).
        digest_runs.cancel_pending(db.database.cursor(), subscriber_id, "unsubscribed")
        return True


def resubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    """Undoes unsubscribe() for the same scope. Digests come back on the cadence they had before
    the digest stream was stopped (daily if it was never recorded)."""
    target = streams.target(scope)
    if target.kind == streams.CATEGORY:
        return _update(_OPT_IN_SQL, (target.category, subscriber_id, token_version))
    if target.kind == streams.DIGESTS:
        return _update(_DIGESTS_ON_SQL, (subscriber_id, token_version))
    if target.kind == streams.NEWSLETTERS:
        return _update(_NEWSLETTERS_ON_SQL, (subscriber_id, token_version))
    return _update(
        "UPDATE subscribers SET unsubscribed_at = NULL, updated_at = now() "
        "WHERE id = %s AND token_version = %s RETURNING id",
        (subscriber_id, token_version),
    )


_OPT_OUT_SQL = (
    "UPDATE subscribers SET category_opt_outs = ARRAY(SELECT DISTINCT c FROM "
    "unnest(array_append(category_opt_outs, %s)) c ORDER BY c), updated_at = now() "
    "WHERE id = %s AND token_version = %s RETURNING id"
)
_OPT_IN_SQL = (
    "UPDATE subscribers SET category_opt_outs = array_remove(category_opt_outs, %s), updated_at = now() "
    "WHERE id = %s AND token_version = %s RETURNING id"
)
# A repeated stop keeps the cadence recorded by the first one.
_DIGESTS_OFF_SQL = (
    "UPDATE subscribers SET digest_cadence_before_off = CASE WHEN digest_cadence <> 'off' THEN digest_cadence "
    "ELSE digest_cadence_before_off END, digest_cadence = 'off', updated_at = now() "
    "WHERE id = %s AND token_version = %s RETURNING id"
)
_DIGESTS_ON_SQL = (
    "UPDATE subscribers SET digest_cadence = CASE WHEN digest_cadence = 'off' "
    "THEN COALESCE(digest_cadence_before_off, 'daily') ELSE digest_cadence END, "
    "digest_cadence_before_off = NULL, updated_at = now() "
    "WHERE id = %s AND token_version = %s RETURNING id"
)
_NEWSLETTERS_OFF_SQL = (
    "UPDATE subscribers SET newsletters_unsubscribed_at = COALESCE(newsletters_unsubscribed_at, now()), "
    "updated_at = now() WHERE id = %s AND token_version = %s RETURNING id"
)
_NEWSLETTERS_ON_SQL = (
    "UPDATE subscribers SET newsletters_unsubscribed_at = NULL, updated_at = now() "
    "WHERE id = %s AND token_version = %s RETURNING id"
)


def _update(sql: str, params: tuple) -> bool:
    return bool(db.query(sql, params))


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
