"""Database reads and writes behind the subscriber pages (sync; endpoints call them in a thread).

Unsubscribe/resubscribe/resume writes are keyed on (id, token_version), so a token revoked between
page load and submit changes nothing there; preference saves go through subscribers.update().
"""
from __future__ import annotations

from app import categories as category_registry
from app import db, subscribers
from digest import runs as digest_runs

# How many topic checkboxes the preference centre shows at most; opt-outs are always shown.
MAX_SHOWN_CATEGORIES = subscribers.MAX_CATEGORIES

_COLUMNS = ("id", "user_id", "email", "name", "timezone", "digest_cadence", "digest_hour", "digest_weekday",
            "category_opt_outs", "paused_until", "unsubscribed_at", "token_version")


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
    """Sorted topics to show: current opt-outs, registered categories (app/categories.py) and the
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
    return [{"key": c.key, "label": c.label, "description": c.description}
            for c in sorted(shown, key=lambda c: (c.label.casefold(), c.key))]


def save_preferences(subscriber_id: int, values: dict) -> None:
    """Validated values (plus paused_until) in one transaction; cancels runs of a dropped cadence."""
    subscribers.update(subscriber_id, values)


def set_paused_until(subscriber_id: int, token_version: int, until) -> None:
    db.query("UPDATE subscribers SET paused_until = %s, updated_at = now() WHERE id = %s AND token_version = %s",
             (until, subscriber_id, token_version))


def unsubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    """Idempotent. A "category:X" scope opts out of that topic only; anything else (no scope, or a
    "newsletter:ID" scope — newsletters are not separate lists here) stops all mail. Returns whether
    the row matched (False = token revoked meanwhile)."""
    category = scope_category(scope)
    with db.database.connection_context(), db.database.atomic():
        if category is not None:
            cur = db.database.execute_sql(
                "UPDATE subscribers SET category_opt_outs = ARRAY(SELECT DISTINCT c FROM "
                "unnest(array_append(category_opt_outs, %s)) c ORDER BY c), updated_at = now() "
                "WHERE id = %s AND token_version = %s", (category, subscriber_id, token_version))
            return cur.rowcount > 0
        # COALESCE keeps the first unsubscribe time when a client repeats the one-click POST.
        cur = db.database.execute_sql(
            "UPDATE subscribers SET unsubscribed_at = COALESCE(unsubscribed_at, now()), updated_at = now() "
            "WHERE id = %s AND token_version = %s", (subscriber_id, token_version))
        if cur.rowcount == 0:
            return False
        # Claims check unsubscribed_at anyway; cancelling queued runs now also keeps the operator's
        # view honest (a run will not show as pending for someone who left).
        digest_runs.cancel_pending(db.database.cursor(), subscriber_id, "unsubscribed")
        return True


def resubscribe(subscriber_id: int, token_version: int, scope: str | None) -> bool:
    category = scope_category(scope)
    if category is not None:
        sql = ("UPDATE subscribers SET category_opt_outs = array_remove(category_opt_outs, %s), updated_at = now() "
               "WHERE id = %s AND token_version = %s RETURNING id")
        params = (category, subscriber_id, token_version)
    else:
        sql = ("UPDATE subscribers SET unsubscribed_at = NULL, updated_at = now() "
               "WHERE id = %s AND token_version = %s RETURNING id")
        params = (subscriber_id, token_version)
    return bool(db.query(sql, params))


def scope_category(scope: str | None) -> str | None:
    if scope and scope.startswith("category:") and len(scope) > len("category:"):
        return scope[len("category:"):]
    return None
