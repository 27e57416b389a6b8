"""Subscriber records: validation shared by the admin API and the preference pages, upsert, erasure."""
from __future__ import annotations

import re
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from app import db
from app.addresses import AddressError, sendable

CADENCES = ("daily", "weekly", "off")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MAX_CATEGORIES = 100

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _sendable(addr: str) -> bool:
    try:
        sendable(addr)
        return True
    except AddressError:
        return False


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
    if not strict and isinstance(value, str):
        text = value.strip()
        # HTML forms send numbers as text. ASCII and short only: str.isdigit() also accepts '²',
        # '٣' and '３', which int() then rejects or silently reads, and a 5000-digit run is no hour.
        if text.isascii() and text.lstrip("-").isdigit() and len(text) <= 6:
            value = int(text)
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
            if not isinstance(value, str) or len(value) > 254 or not _sendable(value):
                err(name, "must be a valid email address")
            else:
                values[name] = value
        elif name == "name":
            if value is None:
                values[name] = ""
            elif not isinstance(value, str) or len(value) > 200 or _CONTROL.search(value):
                err(name, "must be a string of at most 200 characters without line breaks or control characters")
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


# Right to erasure, in one transaction. What is deleted, anonymised and kept is listed in the
# README (API, DELETE). Kept: the address in `suppressions` (reason 'erased'), the minimum needed to
# never mail it again (honouring the objection needs the address: GDPR art. 17(3)(b), 21(3));
# a hash would force every suppression check (claims, outbox, webhooks) to match on hashes.
# Raw SendGrid events carry the address (and our custom_args carry the subscriber id).
ERASE_WEBHOOK_EVENTS = ("DELETE FROM webhook_events WHERE lower(email) = ANY(%(addresses)s) "
                        "OR payload ->> 'subscriber_id' = %(sid_text)s")
ERASE_STEPS = (
    # Keep any earlier reason in `source` (bounce, spamreport...: not personal, useful to support).
    "INSERT INTO suppressions (email, reason, source) VALUES (%(address)s, 'erased', 'erasure') "
    "ON CONFLICT (email) DO UPDATE SET reason = 'erased', "
    "source = 'erasure, was ' || suppressions.reason WHERE suppressions.reason <> 'erased'",
    # A digest is one person's mail: its links (URLs from their events), opens and counters go.
    # Deleting the links cascades to their click history and legacy codes.
    "DELETE FROM email_links WHERE mail_kind = 'digest' AND mail_id = ANY(%(run_ids)s)",
    "DELETE FROM email_link_history WHERE mail_kind = 'digest' AND mail_id = ANY(%(run_ids)s)",
    "DELETE FROM mail_event_counts WHERE mail_kind = 'digest' AND mail_id = ANY(%(run_ids)s)",
    # Newsletter clicks/opens stay as anonymous counts so the newsletter's statistics stay right.
    "UPDATE email_link_history SET subscriber_id = NULL, ip = NULL, user_agent = NULL "
    "WHERE subscriber_id = %(sid)s",
    "UPDATE legacy_link_codes SET subscriber_id = NULL WHERE subscriber_id = %(sid)s",
    # Cascades to digest_runs and email_log (the outbox rows, with the address at send time).
    "DELETE FROM subscribers WHERE id = %(sid)s",
)


def erase(user_id: str) -> bool:
    """Right to erasure: everything about the subscriber is deleted or anonymised, their address
    stays suppressed. True if a subscriber existed (their events are deleted either way)."""
    with db.database.connection_context(), db.database.atomic():
        execute = db.database.execute_sql
        execute("DELETE FROM digest_events WHERE user_id = %s", (user_id,))
        row = execute("SELECT id, lower(email) FROM subscribers WHERE user_id = %s", (user_id,)).fetchone()
        if row is None:
            return False
        params = {"sid": row[0], "sid_text": str(row[0]), **_erasure_scope(execute, *row)}
        # Before any lock the webhook worker may wait for (this subscriber row, the suppression
        # key): it locks its webhook_events rows first, so taking them first too cannot deadlock.
        execute(ERASE_WEBHOOK_EVENTS, params)
        locked = execute("SELECT lower(email) FROM subscribers WHERE id = %s FOR UPDATE", (row[0],)).fetchone()
        if locked is None:  # erased concurrently
            return False
        params["address"] = locked[0]  # the address as of now, should it have just changed
        for statement in ERASE_STEPS:
            execute(statement, params)
        return True


def _erasure_scope(execute, sid: int, address: str) -> dict:
    """Every address the subscriber was mailed at (it may have changed) and their digest runs."""
    addresses = {address} | {e for (e,) in execute(
        "SELECT DISTINCT lower(email) FROM email_log WHERE subscriber_id = %s", (sid,)).fetchall()}
    run_ids = [r for (r,) in execute("SELECT id FROM digest_runs WHERE subscriber_id = %s", (sid,)).fetchall()]
    return {"addresses": sorted(addresses), "run_ids": run_ids}
