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
from app.platform import config, i18n, timezones
from app.platform.i18n import N_
from app.platform.validation import plain_int
from app.subscribers import budget, quiet_hours, records
from app.web.pages import common, csrf, schedule, subscription

log = logging.getLogger("app.web.pages.preferences")

MAX_PAUSE_DAYS = 365
ACTIONS = ("save", "resume", "unsubscribe", "resubscribe")
# Messages, translated where the page is rendered (the subscriber's language).
NOTICES = {
    "resumed": N_("Welcome back: your emails are no longer paused."),
    "unsubscribed": N_("You are unsubscribed from all emails. You can resubscribe below at any time."),
    "resubscribed": N_("You are subscribed again."),
}
FIELD_LABELS = {
    "digest_cadence": N_("How often"),
    "digest_hour": N_("Time of day"),
    "digest_weekday": N_("Weekday"),
    "timezone": N_("Time zone"),
    "category_opt_outs": N_("Topics"),
    "pause_days": N_("Pause"),
    "locale": N_("Language"),
    "quiet_hours": N_("Quiet hours"),
    "max_mails_per_day": N_("Most emails a day"),
}
# What a refused field is told on the page (the API's messages are English, for developers).
FIELD_ERRORS = {
    "digest_cadence": N_("Choose as it happens, hourly, daily, weekly or no digests."),
    "digest_hour": N_("Choose an hour of the day."),
    "digest_weekday": N_("Choose a day of the week."),
    "timezone": N_("Choose a time zone from the list, e.g. Europe/Lisbon."),
    "category_opt_outs": N_("Choose among the topics shown."),
    "pause_days": N_("Enter a whole number of days from 1 to {max}, or leave it empty."),
    "locale": N_("Choose a language from the list."),
    "quiet_hours": N_("Choose both times, and two different ones, or neither."),
    "max_mails_per_day": N_("Choose a number from the list."),
}
CADENCE_CHOICES = (
    ("immediately", N_("As it happens"), N_("An email soon after something happens (a few an hour at most).")),
    ("hourly", N_("Hourly digest"), N_("One email an hour when there is something new.")),
    ("daily", N_("Daily digest"), N_("One email a day with everything new.")),
    ("weekly", N_("Weekly digest"), N_("One email a week, on the weekday you choose.")),
    (
        "off",
        N_("No digests"),
        N_("No notification emails at all, not even urgent ones. You may still get occasional newsletters."),
    ),
)
_A_MONDAY = datetime(2024, 1, 1, 12, tzinfo=UTC)


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
        "locale": subscriber["locale"] or "",
        **_quiet_form(subscriber),
        "max_mails_per_day": _budget_form(subscriber),
    }


def _budget_form(subscriber: dict) -> str:
    limit = subscriber["max_mails_per_day"]
    return "" if limit is None else str(limit)


def _quiet_form(subscriber: dict) -> dict:
    window = records.stored_quiet_hours(subscriber["quiet_hours"]) or {"start": "", "end": ""}
    return {"quiet_start": window["start"], "quiet_end": window["end"]}


QUARTER_HOURS = tuple(f"{h:02d}:{m:02d}" for h in range(24) for m in (0, 15, 30, 45))
BUDGET_CHOICES = (1, 2, 3, 5, 10, 20, 50)  # the page's choices; the API takes 0 to 1000


def budget_choices(t: i18n.Translator, current: int | None = None) -> list[tuple[str, str]]:
    """The budget's choices: first the deployment's default, then no limit, then the numbers (with
    the subscriber's own when the API set one the list lacks, so saving the page keeps it)."""
    default = config.get().default_max_mails_per_day
    label = t.gettext("Default ({limit})", limit=t.number(default)) if default else t.gettext("Default (no limit)")
    numbers = sorted({*BUDGET_CHOICES, *([current] if current else [])})
    return [("", label), ("0", t.gettext("No limit")), *((str(n), t.number(n)) for n in numbers)]


def _budget_label(subscriber: dict, now: datetime, t: i18n.Translator) -> str | None:
    """How much of today's budget is spent, in the subscriber's words; None without a limit."""
    spent, limit = budget.spent_today(subscriber["id"], now)
    if not limit:
        return None
    return t.gettext("Today so far: {spent} of {limit}.", spent=t.number(spent), limit=t.number(limit))


def languages(t: i18n.Translator) -> list[tuple[str, str]]:
    """The shipped languages, each in its own name, and (first, empty) the deployment's default."""
    default = t.gettext("Default ({language})", language=i18n.native_name(i18n.translator(None).tag))
    return [("", default), *((tag, i18n.native_name(tag)) for tag in i18n.SHIPPED)]


def _context(subscriber: dict, form: dict, errors: dict, notice: str | None, t: i18n.Translator) -> dict:
    paused_until = subscriber["paused_until"]
    now = datetime.now(UTC)
    zone = timezones.load(subscriber["timezone"])
    paused_label = None
    if paused_until is not None and paused_until > now:
        paused_label = t.gettext(
            "{date}, {time} {zone}",
            date=t.skeleton(paused_until, "yMMMMEEEEd", zone),
            time=t.skeleton(paused_until, "Hm", zone),
            zone=paused_until.astimezone(zone).tzname() or "",
        )
    return {
        "subscriber": subscriber,
        "topics": form["topics"],
        "form": form,
        "errors": {field: t.gettext(message, max=MAX_PAUSE_DAYS) for field, message in errors.items()},
        "error_list": [
            (field, t.gettext(FIELD_LABELS.get(field, field)), t.gettext(message, max=MAX_PAUSE_DAYS))
            for field, message in errors.items()
        ],
        # After a save, the notice says when the saved schedule sends next.
        "notice": t.gettext(
            "Your preferences are saved. {next_digest}",
            next_digest=schedule.next_digest(subscriber, now, schedule.pending_run_at(subscriber), t),
        )
        if notice == "saved"
        else t.gettext(NOTICES[notice])
        if notice in NOTICES
        else None,
        "cadences": [(value, t.gettext(label), t.gettext(hint)) for value, label, hint in CADENCE_CHOICES],
        "hours": [(h, f"{h:02d}:00") for h in range(24)],
        "weekdays": [(i, t.weekday(_A_MONDAY + timedelta(days=i))) for i in range(7)],
        "timezones": suggested_timezones(),
        "languages": languages(t),
        "quarter_hours": QUARTER_HOURS,
        "default_quiet_label": _default_quiet_label(t),
        "held_label": _held_label(subscriber, now, zone, t),
        "budget_choices": budget_choices(t, subscriber["max_mails_per_day"]),
        "budget_label": _budget_label(subscriber, now, t),
        "paused_label": paused_label,
        "max_pause_days": MAX_PAUSE_DAYS,
    }


def _default_quiet_label(t: i18n.Translator) -> str:
    """The "no window of my own" choice: none, or the deployment's (DEFAULT_QUIET_HOURS)."""
    default = quiet_hours.parse_setting(config.get().default_quiet_hours)
    if default is None:
        return t.gettext("None")
    return t.gettext("Default ({start}–{end})", **default.as_dict())


def _held_label(subscriber: dict, now: datetime, zone, t: i18n.Translator) -> str | None:
    """When the quiet hours holding now end, in the subscriber's words; None outside them."""
    window = quiet_hours.parse_setting(subscriber["quiet_hours"] or config.get().default_quiet_hours)
    until = quiet_hours.held_until(now, zone, window)
    return schedule.when(until, subscriber["timezone"], t) if until else None


def _page(request, token, subscriber, form, errors, notice=None, status_code=200) -> Response:
    t = common.translator_for(request, subscriber)
    context = {**_context(subscriber, form, errors, notice, t), "action_url": _page_url(token)}
    return common.form_page(request, "preferences.html", context, subscriber, status_code)


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
        name: common.text(posted, name)
        for name in ("digest_cadence", "digest_hour", "digest_weekday", "timezone", "locale")
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
    if data.get("locale") == "":  # the first choice: the deployment's default
        data["locale"] = None
    quiet = {k: (common.text(posted, f"quiet_{k}") or "").strip() for k in ("start", "end")}
    if common.text(posted, "quiet_start") is not None or common.text(posted, "quiet_end") is not None:
        # neither: no window of their own (the default's); one alone is refused with the pair's message
        data["quiet_hours"] = None if not any(quiet.values()) else quiet
    budget_raw = common.text(posted, "max_mails_per_day")
    if budget_raw is not None:  # empty: the deployment's default
        data["max_mails_per_day"] = _form_number(budget_raw.strip()) if budget_raw.strip() else None
    if shown:
        data["category_opt_outs"] = opt_outs
    values, error_list = records.validate(data, partial=True)
    errors = {e["field"]: FIELD_ERRORS.get(e["field"], N_("This value is not valid.")) for e in error_list}

    pause_raw = (common.text(posted, "pause_days") or "").strip()
    if pause_raw:
        days = plain_int(pause_raw, 4)
        if days is None or not 1 <= days <= MAX_PAUSE_DAYS:
            errors["pause_days"] = FIELD_ERRORS["pause_days"]
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
        "locale": raw.get("locale", subscriber["locale"] or ""),
        "quiet_start": quiet["start"] if "quiet_hours" in data else _quiet_form(subscriber)["quiet_start"],
        "quiet_end": quiet["end"] if "quiet_hours" in data else _quiet_form(subscriber)["quiet_end"],
        "max_mails_per_day": (budget_raw or "").strip()[:12] if budget_raw is not None else _budget_form(subscriber),
    }
    sticky["topics"] = subscription.topics(sticky["categories"])
    return values, errors, sticky


@common.token_page("preferences")
async def preferences_submit(request: Request, token: str, subscriber: dict, claims) -> Response:
    try:
        posted = await common.read_form(request)
    except common.FormTooLarge:
        return common.error_page(
            request, 413, N_("Form too large"), N_("That form was too large to process."), _page_url(token), subscriber
        )
    except common.BadForm:
        return common.error_page(
            request, 400, N_("Bad request"), N_("That form could not be read."), _page_url(token), subscriber
        )

    if not csrf.valid(request, subscriber["id"], common.text(posted, csrf.FIELD)):
        log.info("preferences POST for subscriber %s rejected: bad CSRF token", subscriber["id"])
        return common.error_page(
            request,
            403,
            N_("Please try again"),
            N_(
                "This form expired or was sent from somewhere else, so nothing was saved. "
                "Open the page again and resubmit."
            ),
            _page_url(token),
            subscriber,
        )

    action = common.text(posted, "action") or "save"
    if action not in ACTIONS:
        return common.error_page(request, 400, N_("Bad request"), N_("Unknown action."), _page_url(token), subscriber)

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
