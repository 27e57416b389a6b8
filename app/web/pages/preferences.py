"""GET/POST /preferences/{token}: the preference centre.

One page, several small forms, each POSTing an `action` back to the same URL:
save (cadence, hour, weekday, time zone, topics, pause), resume, unsubscribe, resubscribe.
Success answers 303 back to the page with a notice (POST/redirect/GET); invalid values answer 422
with the page, the submitted values and field errors, and nothing is saved; a missing or wrong
CSRF token answers 403 and nothing is saved.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.operations import opt_out
from app.platform import timezones
from app.platform.validation import plain_int
from app.subscribers import records
from app.web.pages import common, csrf, schedule, subscription

log = logging.getLogger("app.web.pages.preferences")

MAX_PAUSE_DAYS = 365
ACTIONS = ("save", "resume", "unsubscribe", "resubscribe")
NOTICES = {
    "resumed": "Welcome back: your emails are no longer paused.",
    "unsubscribed": "You are unsubscribed from all emails. You can resubscribe below at any time.",
    "resubscribed": "You are subscribed again.",
}
FIELD_LABELS = {
    "digest_cadence": "How often",
    "digest_hour": "Time of day",
    "digest_weekday": "Weekday",
    "timezone": "Time zone",
    "category_opt_outs": "Topics",
    "pause_days": "Pause",
}
CADENCE_CHOICES = (
    ("immediately", "As it happens", "An email soon after something happens (a few an hour at most)."),
    ("hourly", "Hourly digest", "One email an hour when there is something new."),
    ("daily", "Daily digest", "One email a day with everything new."),
    ("weekly", "Weekly digest", "One email a week, on the weekday you choose."),
    (
        "off",
        "No digests",
        "No notification emails at all, not even urgent ones. You may still get occasional newsletters.",
    ),
)


def _page_url(token: str) -> str:
    return f"/preferences/{quote(token, safe='')}"


def _form_values(subscriber: dict) -> dict:
    """The form's fields as strings, from the stored row (GET) — POST re-renders what was sent."""
    categories = subscription.shown_categories(subscriber)
    return {
        "topics": subscription.topics(categories),
        "digest_cadence": subscriber["digest_cadence"],
        "digest_hour": str(subscriber["digest_hour"]),
        "digest_weekday": str(subscriber["digest_weekday"]),
        "timezone": subscriber["timezone"],
        "categories": categories,
        "receive": {c for c in categories if c not in subscriber["category_opt_outs"]},
        "pause_days": "",
        "newsletters": subscriber["newsletters_unsubscribed_at"] is None,
    }


def _context(subscriber: dict, form: dict, errors: dict, notice: str | None) -> dict:
    paused_until = subscriber["paused_until"]
    now = datetime.now(UTC)
    paused_label = None
    if paused_until is not None and paused_until > now:
        local = paused_until.astimezone(timezones.load(subscriber["timezone"]))
        paused_label = local.strftime("%A %d %B %Y, %H:%M ") + (local.tzname() or "")
    return {
        "subscriber": subscriber,
        "topics": form["topics"],
        "form": form,
        "errors": errors,
        "error_list": [(field, FIELD_LABELS.get(field, field), message) for field, message in errors.items()],
        # After a save, the notice says when the saved schedule sends next.
        "notice": "Your preferences are saved. "
        + schedule.next_digest(subscriber, now, schedule.pending_run_at(subscriber))
        if notice == "saved"
        else NOTICES.get(notice or ""),
        "cadences": CADENCE_CHOICES,
        "hours": [(h, f"{h:02d}:00") for h in range(24)],
        "weekdays": [(i, d.capitalize()) for i, d in enumerate(records.WEEKDAYS)],
        "timezones": suggested_timezones(),
        "paused_label": paused_label,
        "max_pause_days": MAX_PAUSE_DAYS,
    }


def _page(request, token, subscriber, form, errors, notice=None, status_code=200) -> Response:
    context = {**_context(subscriber, form, errors, notice), "action_url": _page_url(token)}
    return common.form_page(request, "preferences.html", context, subscriber["id"], status_code)


@common.token_page("preferences")
async def preferences_page(request: Request, token: str, subscriber: dict, _claims) -> Response:
    form = await run_in_threadpool(_form_values, subscriber)
    return _page(request, token, subscriber, form, {}, notice=request.query_params.get("notice"))


# The suggestion list shows canonical "Area/City" zones (plus UTC); legacy aliases such as
# "US/Eastern" or "Etc/GMT+5" still validate when typed, they are just not suggested.
_AREAS = (
    "Africa/",
    "America/",
    "Antarctica/",
    "Arctic/",
    "Asia/",
    "Atlantic/",
    "Australia/",
    "Europe/",
    "Indian/",
    "Pacific/",
)


@lru_cache(maxsize=1)
def suggested_timezones() -> tuple[str, ...]:
    return ("UTC", *sorted(name for name in timezones.names() if name.startswith(_AREAS)))


@lru_cache(maxsize=1)
def _timezones_by_folded_name() -> dict:
    return {_fold(name): name for name in sorted(timezones.names())}


def _fold(name: str) -> str:
    return name.strip().replace(" ", "_").casefold()


def canonical_timezone(typed: str) -> str:
    """ "europe/lisbon" or "America/New York" -> the IANA spelling; anything else is returned as
    typed, for validation to reject (and the page to show back)."""
    if timezones.valid(typed):
        return typed
    return _timezones_by_folded_name().get(_fold(typed), typed)


def _form_number(text: str) -> int | str:
    """Forms send numbers as text: a plain number of at most 6 digits becomes an int, anything else
    is returned as typed, for validation to name."""
    number = plain_int(text, 6, signed=True)
    return text if number is None else number


def parse_save(posted, subscriber: dict) -> tuple[dict, dict, dict]:
    """(values for subscribers.update, field errors, sticky form values) from the posted form."""
    given = {
        name: common.text(posted, name) for name in ("digest_cadence", "digest_hour", "digest_weekday", "timezone")
    }
    raw = {k: v.strip() for k, v in given.items() if v is not None}
    if "timezone" in raw:
        raw["timezone"] = canonical_timezone(raw["timezone"])
    numbers: dict[str, int | str] = {k: _form_number(raw[k]) for k in ("digest_hour", "digest_weekday") if k in raw}
    # Topics: checkboxes are checked for topics the subscriber wants. Only topics that were on the
    # page change (a topic that appeared since the page loaded keeps its current setting).
    shown = list(dict.fromkeys(common.texts(posted, "shown_category")))[: subscription.MAX_SHOWN_CATEGORIES]
    receive = set(common.texts(posted, "category"))
    current = set(subscriber["category_opt_outs"])
    opt_outs = sorted((current - set(shown)) | {c for c in shown if c not in receive})
    data: dict[str, object] = {**raw, **numbers}
    if shown:
        data["category_opt_outs"] = opt_outs
    values, error_list = records.validate(data, partial=True)
    errors = {e["field"]: e["message"] for e in error_list}
    if "digest_cadence" in errors:
        errors["digest_cadence"] = "Choose as it happens, hourly, daily, weekly or no digests."

    pause_raw = (common.text(posted, "pause_days") or "").strip()
    if pause_raw:
        days = plain_int(pause_raw, 4)
        if days is None or not 1 <= days <= MAX_PAUSE_DAYS:
            errors["pause_days"] = f"must be a whole number of days from 1 to {MAX_PAUSE_DAYS}, or empty"
        else:
            values["paused_until"] = datetime.now(UTC) + timedelta(days=days)

    # Digests turned off here come back on the same cadence from a digest's unsubscribe page.
    if values.get("digest_cadence") == "off" and subscriber["digest_cadence"] != "off":
        values["digest_cadence_before_off"] = subscriber["digest_cadence"]
    elif values.get("digest_cadence", "off") != "off":
        values["digest_cadence_before_off"] = None

    # The newsletter stream: one checkbox, which only counts when the page showed it.
    newsletters = subscriber["newsletters_unsubscribed_at"] is None
    if common.text(posted, "newsletters_shown"):
        newsletters = common.text(posted, "newsletters") is not None
        if newsletters != (subscriber["newsletters_unsubscribed_at"] is None):
            values["newsletters_unsubscribed_at"] = None if newsletters else datetime.now(UTC)

    sticky = {
        "digest_cadence": raw.get("digest_cadence", subscriber["digest_cadence"]),
        "digest_hour": raw.get("digest_hour", str(subscriber["digest_hour"])),
        "digest_weekday": raw.get("digest_weekday", str(subscriber["digest_weekday"])),
        "timezone": raw.get("timezone", subscriber["timezone"]),
        "receive": receive if shown else set(),
        "categories": sorted(set(shown) | current) if shown else sorted(current),
        "pause_days": pause_raw[:12],
        "newsletters": newsletters,
    }
    sticky["topics"] = subscription.topics(sticky["categories"])
    return values, errors, sticky


@common.token_page("preferences")
async def preferences_submit(request: Request, token: str, subscriber: dict, claims) -> Response:
    try:
        posted = await common.read_form(request)
    except common.FormTooLarge:
        return common.error_page(
            request, 413, "Form too large", "That form was too large to process.", _page_url(token)
        )
    except common.BadForm:
        return common.error_page(request, 400, "Bad request", "That form could not be read.", _page_url(token))

    if not csrf.valid(request, subscriber["id"], common.text(posted, csrf.FIELD)):
        log.info("preferences POST for subscriber %s rejected: bad CSRF token", subscriber["id"])
        return common.error_page(
            request,
            403,
            "Please try again",
            "This form expired or was sent from somewhere else, so nothing was saved. "
            "Open the page again and resubmit.",
            _page_url(token),
        )

    action = common.text(posted, "action") or "save"
    if action not in ACTIONS:
        return common.error_page(request, 400, "Bad request", "Unknown action.", _page_url(token))

    sid, version = subscriber["id"], claims.token_version
    if action == "save":
        values, errors, sticky = parse_save(posted, subscriber)
        if errors:
            return _page(request, token, subscriber, sticky, errors, status_code=422)
        await run_in_threadpool(subscription.save_preferences, sid, values)
        log.info("subscriber %s saved preferences: %s", sid, sorted(values))
        notice = "saved"
    elif action == "resume":
        await run_in_threadpool(subscription.set_paused_until, sid, version, None)
        notice = "resumed"
    elif action == "unsubscribe":
        await run_in_threadpool(opt_out.unsubscribe, sid, version, None)
        log.info("subscriber %s unsubscribed from the preference centre", sid)
        notice = "unsubscribed"
    else:
        await run_in_threadpool(opt_out.resubscribe, sid, version, None)
        log.info("subscriber %s resubscribed from the preference centre", sid)
        notice = "resubscribed"
    return common.back_to(_page_url(token), notice)
