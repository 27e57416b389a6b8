"""Subscriber records: validation shared by the admin API and the preference pages, upsert, erasure."""
from __future__ import annotations

import re
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from app import db

CADENCES = ("daily", "weekly", "off")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# Deliberately loose (the provider is the real judge) but nothing that can break a header.
_LOCAL = r"[^@\x00-\x20\x7f-\xa0<>\",;()\[\]\\:]"  # no controls, spaces or header specials
_DOMAIN = r"[^@\x00-\x20\x7f-\xa0<>\",;()\[\]\\:'.]"
EMAIL_PATTERN = rf"^{_LOCAL}+@{_DOMAIN}+(\.{_DOMAIN}+)+$"
EMAIL_RE = re.compile(EMAIL_PATTERN)
MAX_CATEGORIES = 100

FIELDS = ("email", "name", "timezone", "digest_cadence", "digest_hour", "digest_weekday",
          "category_opt_outs", "tracking_opt_out")
DEFAULTS = {"name": "", "timezone": "UTC", "digest_cadence": "daily", "digest_hour": 9,
            "digest_weekday": 0, "category_opt_outs": [], "tracking_opt_out": False}


@lru_cache(maxsize=1)
def timezones() -> tuple[str, ...]:
    return tuple(sorted(name for name in available_timezones() if valid_timezone(name)))


def valid_timezone(name) -> bool:
    if not isinstance(name, str) or not name or len(name) > 64 or ".." in name or name.startswith("/"):
        return False
    try:
        ZoneInfo(name)
        return True
    except (ZoneInfoNotFoundError, ValueError):
        return False


def _int_in(value, low, high, strict=False):
    if isinstance(value, bool):
        return None
    if not strict and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # HTML forms send numbers as text
    if isinstance(value, int) and low <= value <= high:
        return value
    return None


def validate(data: dict, partial: bool = False, strict: bool = False) -> tuple[dict, list[dict]]:
    """Clean values and a list of {field, message}; `partial` checks only the fields present.
    `strict` (the JSON API) takes numbers only as JSON numbers; forms send them as text."""
    values, errors = {}, []

    def err(field, message):
        errors.append({"field": field, "message": message})

    if not isinstance(data, dict):
        return {}, [{"field": "body", "message": "expected a JSON object"}]
    for name in sorted(set(data) - set(FIELDS) - {"user_id"}):
        err(name, "unknown field")
    for name in FIELDS:
        if name not in data:
            if name == "email" and not partial:
                err("email", "is required")
            elif not partial:
                values[name] = DEFAULTS[name]
            continue
        value = data[name]
        if name == "email":
            if not isinstance(value, str) or len(value) > 254 or not EMAIL_RE.fullmatch(value):
                err(name, "must be a valid email address")
            else:
                values[name] = value
        elif name == "name":
            if value is None:
                values[name] = ""
            elif not isinstance(value, str) or len(value) > 200 or "\x00" in value:
                err(name, "must be a string of at most 200 characters")
            else:
                values[name] = value.strip()
        elif name == "timezone":
            if not valid_timezone(value):
                err(name, "must be an IANA time zone name, e.g. Europe/Lisbon")
            else:
                values[name] = value
        elif name == "digest_cadence":
            if value not in CADENCES:
                err(name, f"must be one of {', '.join(CADENCES)}")
            else:
                values[name] = value
        elif name == "digest_hour":
            hour = _int_in(value, 0, 23, strict)
            if hour is None:
                err(name, "must be an integer hour from 0 to 23 (local time)")
            else:
                values[name] = hour
        elif name == "digest_weekday":
            day = WEEKDAYS.index(value.lower()) if isinstance(value, str) and value.lower() in WEEKDAYS \
                else _int_in(value, 0, 6, strict)
            if day is None:
                err(name, "must be 0-6 (0 = Monday) or a weekday name")
            else:
                values[name] = day
        elif name == "category_opt_outs":
            if not isinstance(value, list) or len(value) > MAX_CATEGORIES or not all(
                isinstance(c, str) and 0 < len(c) <= 100 and "\x00" not in c for c in value
            ):
                err(name, f"must be a list of at most {MAX_CATEGORIES} category names")
            else:
                values[name] = sorted(set(value))
        elif name == "tracking_opt_out":
            if not isinstance(value, bool):
                err(name, "must be true or false")
            else:
                values[name] = value
    return values, errors


COLUMNS = ("id", "user_id", "email", "name", "timezone", "digest_cadence", "digest_hour", "digest_weekday",
           "category_opt_outs", "tracking_opt_out", "paused_until", "unsubscribed_at", "created_at",
           "updated_at")


def _as_dict(row) -> dict:
    out = dict(zip(COLUMNS, row))
    for k in ("paused_until", "unsubscribed_at", "created_at", "updated_at"):
        if out[k] is not None:
            out[k] = out[k].isoformat()
    out["digest_weekday_name"] = WEEKDAYS[out["digest_weekday"]]
    return out


def get(user_id: str) -> dict | None:
    rows = db.query(f"SELECT {', '.join(COLUMNS)} FROM subscribers WHERE user_id = %s", (user_id,))
    return _as_dict(rows[0]) if rows else None


def upsert(user_id: str, values: dict) -> tuple[dict, bool]:
    """Create or replace; returns (subscriber, created). A changed schedule cancels the pending runs
    planned for the old one (trigger subscribers_schedule_changed, migration 0004)."""
    cols = [c for c in FIELDS if c in values]
    params = [user_id] + [values[c] for c in cols]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols)
    with db.database.connection_context(), db.database.atomic():
        row = db.database.execute_sql(
            f"INSERT INTO subscribers (user_id, {', '.join(cols)}) VALUES (%s, {', '.join(['%s'] * len(cols))}) "
            f"ON CONFLICT (user_id) DO UPDATE SET {updates}, updated_at = now() "
            f"RETURNING {', '.join(COLUMNS)}, (xmax = 0) AS created",
            params,
        ).fetchone()
    return _as_dict(row[:-1]), row[-1]


def update(subscriber_id: int, values: dict) -> None:
    """Partial update by id (preference pages). A changed schedule cancels pending runs (see upsert)."""
    if not values:
        return
    sets = ", ".join(f"{c} = %s" for c in values)
    db.query(f"UPDATE subscribers SET {sets}, updated_at = now() WHERE id = %s", [*values.values(), subscriber_id])


def erase(user_id: str) -> bool:
    """Right to erasure: the subscriber, their events, runs and outbox rows. True if one existed."""
    with db.database.connection_context(), db.database.atomic():
        db.database.execute_sql("DELETE FROM digest_events WHERE user_id = %s", (user_id,))
        cur = db.database.execute_sql("DELETE FROM subscribers WHERE user_id = %s", (user_id,))
        return cur.rowcount > 0
