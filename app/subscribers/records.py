"""Subscriber records: validation shared by the admin API and the preference pages, upsert, erasure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

import orjson
from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, TypeAdapter, WithJsonSchema

from app.platform import config, db, i18n, timezones
from app.platform.addresses import EMAIL_PATTERN, AddressError, canonical, check_domain, sendable
from app.platform.validation import (
    LOCALE_SCHEMA,
    NO_CONTROL,
    Body,
    Integer,
    Text,
    check,
    documented,
    fail,
    whole_number,
)
from app.subscribers import quiet_hours, streams

CADENCES = ("immediately", "hourly", "daily", "weekly", "off")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MAX_CATEGORIES = 100


def _email(value: str) -> str:
    try:
        sendable(value)
    except AddressError:
        raise fail("email", "must be a valid email address") from None
    try:
        check_domain(value)  # so that the address has one canonical form (README "Address identity")
    except AddressError:
        raise fail(
            "email", "must be a valid email address: its domain is not a valid internationalised domain name (IDNA)"
        ) from None
    return value


def _timezone(value: str) -> str:
    if not timezones.valid(value):
        raise fail("timezone", "must be an IANA time zone name, e.g. Europe/Lisbon")
    return value


def _timezone_names(schema: dict) -> None:
    schema.update(enum=sorted(timezones.names()), description="IANA zone")


def _weekday(value) -> int:
    value = whole_number(value)
    if isinstance(value, str) and value.lower() in WEEKDAYS:
        return WEEKDAYS.index(value.lower())
    if type(value) is int and 0 <= value <= 6:  # not a bool
        return value
    raise fail("weekday", "must be 0-6 (0 = Monday) or a weekday name")


_WEEKDAY_SCHEMA = {
    "oneOf": [
        {"type": "integer", "minimum": 0, "maximum": 6, "description": "0 = Monday"},
        {"type": "string", "enum": list(WEEKDAYS)},
    ]
}


Category = Text(100, min_length=1)


_HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
_QUIET_HOURS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "start": {"type": "string", "pattern": _HHMM, "description": "HH:MM, when the quiet starts"},
                "end": {"type": "string", "pattern": _HHMM, "description": "HH:MM, when it ends; not start"},
            },
            "required": ["start", "end"],
            "additionalProperties": False,
        },
        {"type": "null"},
    ],
    "description": "no digest or notification mail arrives between start and end, wall-clock times in the "
    "subscriber's zone (the window may cross midnight); what comes meanwhile goes as one mail when it ends. "
    "null: DEFAULT_QUIET_HOURS",
}


def _quiet_hours(value: object) -> str | None:
    """{"start": "22:00", "end": "07:00"} in, stored as "22:00-07:00" (app/subscribers/quiet_hours.py)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"start", "end"}:
        raise fail("quiet_hours", 'must be {"start": "HH:MM", "end": "HH:MM"} or null')
    try:
        return quiet_hours.as_setting(quiet_hours.window(value["start"], value["end"]))
    except quiet_hours.QuietHoursError as exc:
        raise fail("quiet_hours", str(exc)) from None


def stored_quiet_hours(text: str | None) -> dict | None:
    """The API's form of the stored window: {"start": "22:00", "end": "07:00"}, or None."""
    found = quiet_hours.parse_setting(text or "")
    return found.as_dict() if found else None


def _locale(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return i18n.normalize(value)
    except i18n.LocaleError:
        raise fail("locale", "must be a BCP 47 language tag this service knows, e.g. en, pt-BR, de or ar") from None


def _locale_schema(schema: dict) -> None:
    schema.clear()
    schema.update(
        anyOf=[dict(LOCALE_SCHEMA), {"type": "null"}],  # the enum of i18n.known(), by reference
        description="the subscriber's language, a BCP 47 tag CLDR knows (`pt-BR`, `de`, `ar`; `pt_br` is "
        "stored as `pt-BR`); "
        f"null: DEFAULT_LOCALE. Shipped translations: {', '.join(i18n.SHIPPED)}; another known tag gets its "
        "dates and numbers, and the words of its language's fallback chain",
    )


# A deliverable address, as the API takes it wherever one is given (subscribers, test sends).
# `idn-email` (JSON Schema: RFC 6531, its domain an IDNA name) says what the pattern cannot: the domain
# check, which refuses what a pattern-valid address may still have (a label over 63 characters, an `_`).
Email = Annotated[
    Text(
        254,
        EMAIL_PATTERN,
        message="must be a valid email address",
        json_schema_extra={"format": "idn-email"},
        description="an email address whose domain is a valid IDNA name (UTS 46); compared "
        'with other addresses by its canonical form (README "Address identity")',
    ),
    AfterValidator(_email),
]


class SubscriberInput(Body):
    """PUT /v1/subscribers/{user_id} (the preference pages send a subset of the same fields)."""

    email: Email
    name: Annotated[
        Text(200, NO_CONTROL) | None,
        Field(description="display name; no line breaks or control characters"),
        AfterValidator(lambda v: (v or "").strip()),
    ] = ""
    timezone: Annotated[str, *documented(_timezone_names, _timezone)] = "UTC"
    digest_cadence: Literal[CADENCES] = "daily"
    digest_hour: Integer(ge=0, le=23, description="local hour") = 9
    digest_weekday: Annotated[int, PlainValidator(_weekday), WithJsonSchema(_WEEKDAY_SCHEMA)] = 0
    category_opt_outs: Annotated[
        list[Category], Field(max_length=MAX_CATEGORIES), AfterValidator(lambda v: sorted(set(v)))
    ] = []
    tracking_opt_out: bool = False
    locale: Annotated[str | None, *documented(_locale_schema, _locale)] = None
    quiet_hours: Annotated[str | None, BeforeValidator(_quiet_hours), WithJsonSchema(_QUIET_HOURS_SCHEMA)] = None
    max_mails_per_day: Annotated[
        Integer(
            ge=0,
            le=1000,
            description="most mails in the subscriber's local day (0: no limit): digests, send-now, critical and "
            "newsletter mail count; send-now mail over it folds into the next digest, newsletters wait for the "
            "next day, digests and critical mail still go. null: DEFAULT_MAX_MAILS_PER_DAY",
        )
        | None,
        Field(),
    ] = None


FIELDS = tuple(SubscriberInput.model_fields)
DEFAULTS = {name: info.default for name, info in SubscriberInput.model_fields.items() if not info.is_required()}
_field_checks = {
    name: TypeAdapter(
        Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation,  # type: ignore[arg-type]
        config=SubscriberInput.model_config,
    )
    for name, info in SubscriberInput.model_fields.items()
}


def validate(data, partial: bool = False) -> tuple[dict, list[dict]]:
    """(clean values, problems as {field, message}). `partial` checks only the fields present and
    fills no defaults (the preference pages change a few fields at a time)."""
    if not partial:
        model, errors = check(SubscriberInput, data)
        return (model.model_dump() if model else {}), errors
    values, errors = {}, []
    if not isinstance(data, dict):
        return {}, [{"field": "body", "message": "must be a JSON object"}]
    for name, value in data.items():
        if name not in _field_checks:
            errors.append({"field": name, "message": "unknown field"})
            continue
        clean, problems = check(_field_checks[name], value)
        if problems:
            errors.append({"field": name, "message": problems[0]["message"]})
        else:
            values[name] = clean
    return values, errors


REQUIRED = frozenset(name for name, info in SubscriberInput.model_fields.items() if info.is_required())


def _merge_patch_schema(schema: dict) -> None:
    """SubscriberInput's fields, none required, null allowed where PUT has a default (and meaning
    that default): the document of what validate_merge_patch accepts."""
    full = SubscriberInput.model_json_schema(mode="validation")
    properties = {}
    for name, prop in full["properties"].items():
        prop = {k: v for k, v in prop.items() if k not in ("default", "title")}
        if name in REQUIRED:
            properties[name] = {**prop, "description": prop.get("description", name) + "; never null"}
            continue
        cleared = f"null: back to {orjson.dumps(DEFAULTS[name]).decode()}"
        description = prop.pop("description", None)
        options = prop["anyOf"] if {"type": "null"} in prop.get("anyOf", []) else [prop, {"type": "null"}]
        properties[name] = {"anyOf": options, "description": f"{description}; {cleared}" if description else cleared}
    schema["properties"] = properties
    schema.pop("required", None)


class SubscriberPatch(Body):
    """PATCH /v1/subscribers/{user_id}: a JSON merge patch (RFC 7396) of SubscriberInput. Declared for
    the OpenAPI document only (its schema is SubscriberInput's, made optional and nullable);
    validate_merge_patch checks a patch."""

    model_config = {**Body.model_config, "json_schema_extra": _merge_patch_schema}


def validate_merge_patch(data) -> tuple[dict, list[dict]]:
    """A JSON merge patch (RFC 7396) of a subscriber: the fields named, checked as PUT checks them;
    null clears an optional field back to what PUT fills in when it is omitted, and is refused for a
    required one (the preference pages' partial check, plus what null means)."""
    if not isinstance(data, dict):
        return {}, [{"field": "body", "message": "must be a JSON object (a merge patch)"}]
    cleared = {name: DEFAULTS[name] for name, value in data.items() if value is None and name in DEFAULTS}
    required = [name for name, value in data.items() if value is None and name in REQUIRED]
    values, errors = validate({k: v for k, v in data.items() if k not in cleared and k not in required}, partial=True)
    errors += [{"field": name, "message": "is required and cannot be null"} for name in required]
    return {**values, **cleared}, errors


COLUMNS = (
    "id",
    "user_id",
    "email",
    "name",
    "timezone",
    "digest_cadence",
    "digest_hour",
    "digest_weekday",
    "category_opt_outs",
    "tracking_opt_out",
    "locale",
    "quiet_hours",
    "max_mails_per_day",
    "paused_until",
    "unsubscribed_at",
    "created_at",
    "updated_at",
)


def _as_dict(row) -> dict:
    out = dict(zip(COLUMNS, row))
    for k in ("paused_until", "unsubscribed_at", "created_at", "updated_at"):
        if out[k] is not None:
            out[k] = out[k].isoformat()
    out["digest_weekday_name"] = WEEKDAYS[out["digest_weekday"]]
    stored = out["quiet_hours"]
    out["quiet_hours"] = stored_quiet_hours(stored)
    # Mail that would go now waits until this moment (the quiet window holding now ends); null: it goes.
    window = quiet_hours.parse_setting(stored or config.get().default_quiet_hours)
    until = quiet_hours.held_until(datetime.now(UTC), timezones.load(out["timezone"]), window)
    out["held_until"] = until.isoformat() if until else None
    return out


def get(user_id: str) -> dict | None:
    rows = db.query(f"SELECT {', '.join(COLUMNS)} FROM subscribers WHERE user_id = %s", (user_id,))
    return _as_dict(rows[0]) if rows else None


# The subscriber's own pages need more than the API shows: the token generation their links carry,
# and the stream and cadence state they offer to restore.
_PAGE_COLUMNS = (*COLUMNS, "token_version", "newsletters_unsubscribed_at", "digest_cadence_before_off")


def load_by_id(subscriber_id: int) -> dict | None:
    """The row as stored (datetimes stay datetimes), for the pages a signed link opens."""
    rows = db.query(f"SELECT {', '.join(_PAGE_COLUMNS)} FROM subscribers WHERE id = %s", (subscriber_id,))
    if not rows:
        return None
    record = dict(zip(_PAGE_COLUMNS, rows[0]))
    record["category_opt_outs"] = list(record["category_opt_outs"] or [])
    return record


def _with_canonical_email(values: dict) -> dict:
    """The one place a subscriber's address gets its identity (app/platform/addresses.py `canonical`)."""
    return {**values, "canonical_email": canonical(values["email"])} if "email" in values else values


def upsert(user_id: str, values: dict) -> tuple[dict, bool]:
    """Create or replace; returns (subscriber, created). A changed schedule cancels the pending runs
    planned for the old one (trigger subscribers_schedule_changed, migration 0004)."""
    values = _with_canonical_email(values)
    cols = [c for c in (*FIELDS, "canonical_email") if c in values]
    params = [user_id] + [values[c] for c in cols]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols)
    with db.raw_cursor() as cur:
        cur.execute(
            f"INSERT INTO subscribers (user_id, {', '.join(cols)}) VALUES (%s, {', '.join(['%s'] * len(cols))}) "
            f"ON CONFLICT (user_id) DO UPDATE SET {updates}, updated_at = now() "
            f"RETURNING {', '.join(COLUMNS)}, (xmax = 0) AS created",
            params,
        )
        row = cur.fetchone()
    return _as_dict(row[:-1]), row[-1]


def patch(user_id: str, values: dict) -> dict | None:
    """Change only the named fields, in one UPDATE of those columns (never read-modify-write, so
    two patches of different fields at once both land). None if there is no such subscriber. A
    changed schedule cancels pending runs (see upsert)."""
    values = _with_canonical_email(values)
    sets = "".join(f"{c} = %s, " for c in values)
    rows = db.query(
        f"UPDATE subscribers SET {sets}updated_at = now() WHERE user_id = %s RETURNING {', '.join(COLUMNS)}",
        [*values.values(), user_id],
    )
    return _as_dict(rows[0]) if rows else None


def update(subscriber_id: int, values: dict) -> None:
    """Partial update by id (preference pages). A changed schedule cancels pending runs (see upsert)."""
    if not values:
        return
    values = _with_canonical_email(values)
    sets = ", ".join(f"{c} = %s" for c in values)
    db.query(f"UPDATE subscribers SET {sets}, updated_at = now() WHERE id = %s", [*values.values(), subscriber_id])


# -- stops and restarts from the subscriber pages -----------------------------------------------------
# Keyed on (id, token_version): a token revoked between page load and submit changes nothing.
# Each RETURNING id: whether the row matched.
_STOP = {
    # COALESCE keeps the first unsubscribe time when a client repeats the one-click POST.
    streams.EVERYTHING: "UPDATE subscribers SET unsubscribed_at = COALESCE(unsubscribed_at, now()), updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    streams.CATEGORY: "UPDATE subscribers SET category_opt_outs = ARRAY(SELECT DISTINCT c FROM "
    "unnest(array_append(category_opt_outs, %(category)s)) c ORDER BY c), updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    # A repeated stop keeps the cadence recorded by the first one.
    streams.DIGESTS: "UPDATE subscribers SET digest_cadence_before_off = CASE WHEN digest_cadence <> 'off' "
    "THEN digest_cadence ELSE digest_cadence_before_off END, digest_cadence = 'off', updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    streams.NEWSLETTERS: "UPDATE subscribers SET newsletters_unsubscribed_at = "
    "COALESCE(newsletters_unsubscribed_at, now()), updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
}
_RESTART = {
    streams.EVERYTHING: "UPDATE subscribers SET unsubscribed_at = NULL, updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    streams.CATEGORY: "UPDATE subscribers SET category_opt_outs = array_remove(category_opt_outs, %(category)s), "
    "updated_at = now() WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    # Digests come back on the cadence they had before the stream was stopped (daily if never recorded).
    streams.DIGESTS: "UPDATE subscribers SET digest_cadence = CASE WHEN digest_cadence = 'off' "
    "THEN COALESCE(digest_cadence_before_off, 'daily') ELSE digest_cadence END, "
    "digest_cadence_before_off = NULL, updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
    streams.NEWSLETTERS: "UPDATE subscribers SET newsletters_unsubscribed_at = NULL, updated_at = now() "
    "WHERE id = %(id)s AND token_version = %(version)s RETURNING id",
}


def stop(cur, subscriber_id: int, token_version: int, target: streams.Target) -> bool:
    """Stop what `target` names (idempotent). False: the token was revoked meanwhile."""
    cur.execute(_STOP[target.kind], {"id": subscriber_id, "version": token_version, "category": target.category})
    return cur.fetchone() is not None


def restart(cur, subscriber_id: int, token_version: int, target: streams.Target) -> bool:
    """Undo stop() for the same target. False: the token was revoked meanwhile."""
    cur.execute(_RESTART[target.kind], {"id": subscriber_id, "version": token_version, "category": target.category})
    return cur.fetchone() is not None


def set_paused_until(subscriber_id: int, token_version: int, until) -> None:
    db.query(
        "UPDATE subscribers SET paused_until = %s, updated_at = now() WHERE id = %s AND token_version = %s",
        (until, subscriber_id, token_version),
    )


# -- digest planning (digest/plan.py) -------------------------------------------------------------
def set_planned_until(until: str, source: str, match: str, returning: str = "s.id") -> str:
    """SQL for a CTE of a planning statement: record until when the subscribers `s` that `match`
    (SQL over `s` and `source`, a FROM list) are planned, so a subscriber's planned_until and their
    run commit together. `until` is SQL; RETURNING `returning`."""
    return f"UPDATE subscribers s SET digest_planned_until = {until} FROM {source} WHERE {match} RETURNING {returning}"


# -- soft bounces (tracking/webhook_apply.py, the dashboard's suppression removal) -------------------
# By the subscriber the event names when it is theirs, else every subscriber with the address.
def _one_or_by_address(subscriber_id: int | None, address: str) -> tuple[str, tuple]:
    return ("id = %s", (subscriber_id,)) if subscriber_id else ("canonical_email = %s", (address,))


def count_soft_bounce(cur, subscriber_id: int | None, address: str) -> int:
    """One more soft bounce; returns the highest count now (0: no such subscriber)."""
    where, params = _one_or_by_address(subscriber_id, address)
    cur.execute(
        f"UPDATE subscribers SET soft_bounce_count = soft_bounce_count + 1 WHERE {where} RETURNING soft_bounce_count",
        params,
    )
    return max((row[0] for row in cur.fetchall()), default=0)


def reset_soft_bounces(cur, subscriber_id: int | None, address: str) -> None:
    """A delivery (or an operator's removal of the suppression) starts the count again."""
    where, params = _one_or_by_address(subscriber_id, address)
    cur.execute(f"UPDATE subscribers SET soft_bounce_count = 0 WHERE {where} AND soft_bounce_count > 0", params)


def ids_by_address(addresses: list[str]) -> dict[str, int]:
    """{canonical address: the lowest subscriber id with it} for the addresses that have one."""
    if not addresses:
        return {}
    rows = db.query(
        "SELECT canonical_email, min(id) FROM subscribers WHERE canonical_email = ANY(%s) GROUP BY canonical_email",
        (addresses,),
    )
    return dict(rows)


# -- right to erasure: this domain's steps (app/operations/erasure.py composes every domain's) -------
def find(cur: db.Cursor, user_id: str) -> tuple[int, str] | None:
    """(id, canonical address) of the subscriber with this user_id, unlocked."""
    cur.execute("SELECT id, canonical_email FROM subscribers WHERE user_id = %s", (user_id,))
    row = cur.fetchone()
    return (row[0], row[1]) if row else None


def lock(cur: db.Cursor, subscriber_id: int) -> str | None:
    """Lock the row for the rest of the transaction; its canonical address as of now (None: gone)."""
    cur.execute("SELECT canonical_email FROM subscribers WHERE id = %s FOR UPDATE", (subscriber_id,))
    row = cur.fetchone()
    return row[0] if row else None


def delete(cur: db.Cursor, subscriber_id: int) -> None:
    """The row itself; its digest runs and outbox rows (with the address at send time) cascade."""
    cur.execute("DELETE FROM subscribers WHERE id = %s", (subscriber_id,))
