"""Newsletter operations behind the admin API and the CLI: create, send, pause, resume, cancel,
retry failed rows, and status with counts. Every state change is one conditional UPDATE, so two
operators (or a retried request) racing each other cannot produce an impossible state."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, create_model

from app.newsletter import kick, outbox, template
from app.newsletter import rows as newsletter_rows
from app.platform import db, mail
from app.platform.errors import Conflict, NotFound
from app.platform.validation import Body, LocaleKey, Text, Timestamp, check, distinct_locales, documented, fail, keyed
from tracking.stats import mail_stats

log = logging.getLogger("app.newsletter.service")

MAX_AUDIENCE_USER_IDS = 10_000
MAX_VARIANTS = 20  # languages per newsletter besides the default
# Characters of every variant's subject, html and text together (each field has its own limit, as
# the default's); app/web/api/newsletters.py derives the body limit from it.
MAX_VARIANTS_CHARS = 2 * 1024 * 1024
ROW_STATUSES = tuple(status.value for status in newsletter_rows.RowStatus)
# Applied SendGrid events (mail_event_counts) that count as a bounce / an unsubscribe.
BOUNCE_EVENTS = ("bounce", "dropped", "blocked")
UNSUBSCRIBE_EVENTS = ("unsubscribe", "group_unsubscribe", "spamreport")


__all__ = ["Conflict", "NotFound"]  # the domain's errors (app/platform/errors.py), as the CLI names them
NOT_FOUND = "no newsletter with that id"
UNKNOWN_SHOWN = 1000  # unknown user_ids listed in a send answer (the count is always whole)


# -- the results: what the operations return, and the API answers as they are --------------------
STATUSES = tuple(newsletter_rows.NewsletterStatus)
Count = Annotated[int, Field(ge=0)]


class Engagement(BaseModel):
    total: Count
    human: Count
    machine: Count
    unique_human: Count


class AudienceSummary(BaseModel):
    kind: Literal["all", "user_ids"]
    count: Count | None = None


# One field per status, from the statuses themselves (mypy cannot follow fields given as keywords).
RowCounts = create_model("RowCounts", **dict.fromkeys((*ROW_STATUSES, "total"), (Count, ...)))  # type: ignore[call-overload]


class NewsletterSummary(BaseModel):
    """One item of GET /v1/newsletters."""

    id: int
    subject: str
    status: Literal[STATUSES]
    audience: AudienceSummary | None
    created_at: Timestamp
    send_requested_at: Timestamp | None
    send_at: Timestamp | None = Field(
        description="what a scheduled newsletter is (or was) scheduled for (null: sent when requested)"
    )
    started_at: Timestamp | None = Field(
        description="when the send started: at the request, or when send_at came (null: not started)"
    )
    local_time: str | None = Field(description="HH:MM each recipient gets it at in their own time zone")
    respect_quiet_hours: bool = Field(description="each recipient's mail waits while their quiet hours hold it")
    completed_at: Timestamp | None
    counts: RowCounts
    variant_locales: list[str] = Field(
        description="the locales of its variants (languages), by tag; []: the default subject and html only. "
        "GET /v1/newsletters/{id} counts recipients, sent, opened and clicked per variant"
    )


class NewsletterPage(BaseModel):
    """GET /v1/newsletters: newest first; pass `next_before` as `before` for the next page (null: last page)."""

    newsletters: list[NewsletterSummary]
    next_before: int | None


class VariantCounts(BaseModel):
    """One variant's recipients: its outbox rows, those sent, and the people who opened or clicked
    (unique, machines apart)."""

    locale: str | None = Field(description="the variant's locale tag; null: the default subject/html")
    recipients: Count
    sent: Count
    opened: Count
    clicked: Count


class NewsletterStatus(NewsletterSummary):
    """GET /v1/newsletters/{id}: what a list shows of it, and its sender, engagement and bounces."""

    sender: str | None = Field(alias="from")
    outbox_completed_at: Timestamp | None
    opens: Engagement
    clicks: Engagement
    bounces: Count
    unsubscribes: Count
    variants: list[VariantCounts] = Field(
        description="per variant (the default first, then by tag): recipients, sent, unique human openers and clickers"
    )


class NewsletterState(BaseModel):
    id: int
    status: Literal[STATUSES]


class SendRequested(NewsletterState):
    unknown_user_ids: Annotated[list[str], Field(max_length=UNKNOWN_SHOWN)]
    unknown_user_ids_count: Count


class Cancelled(NewsletterState):
    cancelled_rows: Count


class Requeued(NewsletterState):
    requeued: Count


# The sender: "addr" or "Name <addr>" — exactly one mailbox, so the name has none of RFC 5322's
# specials and the address is plain ASCII (it goes in every envelope). Shared with the OpenAPI
# document, so the documented pattern is exactly what is accepted.
_SENDER_ADDR = (
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
)
# The name: none of RFC 5322's specials, no control character, no Unicode line break.
_SENDER_NAME = r"[^<>()\[\]:;@\\,.\"\x00-\x1f\x7f-\x9f\u2028\u2029]*"
SENDER_PATTERN = rf"^(?:{_SENDER_ADDR}|{_SENDER_NAME}<{_SENDER_ADDR}>)$"
_TEMPLATE_HELP = (  # % keeps the Mustache braces in the text as they are
    "is not a supported template: Mustache tags allowed are {{var}}, {{{var}}}, {{&var}}, {{! comment }}, "  # noqa: UP031
    "{{#var}}...{{/var}} and {{^var}}...{{/var}} (nested at most %d deep; {{.}} only inside a section); "
    "a literal '{' must not start '{{'; variables: %s" % (template.SECTION_DEPTH, ", ".join(template.VARIABLES))
)


def _sender(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        mail.parse_mailbox(value.strip())
    except mail.MailBuildError:
        raise fail("from", _FROM_MESSAGE) from None
    return value.strip()


def _template(field: str, max_length: int, description: str):
    """A Mustache template field: the grammar is its documented pattern; the checks below explain
    the common mistakes more precisely than "does not match"."""
    pattern = template.SUBJECT_PATTERN if field == "subject" else template.BODY_PATTERN

    def check_template(value: str) -> str:
        if not value.strip():
            raise fail("blank", "must be a non-empty string")
        if "\x00" in value:
            raise fail("nul", "must not contain NUL characters")
        if field == "subject" and any(c in template.SUBJECT_FORBIDDEN for c in value):
            raise fail("line", "must be a single line without control characters")
        if not template.matches_grammar(field, value):
            explained = template.check(field, value)
            raise fail("template", explained[0]["message"] if explained else _TEMPLATE_HELP)
        return value

    return Annotated[
        str,
        Field(min_length=1, max_length=max_length, description=description + _GRAMMAR_DOC),
        *documented({"pattern": pattern}, check_template),
    ]


_VARS = "Mustache with " + ", ".join(template.VARIABLES)
_GRAMMAR_DOC = (
    f"; tags: {{{{var}}}}, {{{{{{var}}}}}}, {{{{&var}}}}, {{{{! comment }}}}, {{{{#var}}}}/{{{{^var}}}}"
    f"...{{{{/var}}}} sections (at most {template.SECTION_DEPTH} deep, {{{{.}}}} inside them); "
    "no partials or delimiter changes; not blank; no U+0000"
)
_FROM_MESSAGE = "must be exactly one address like 'News <news@example.com>'"


class NewsletterVariant(Body):
    """One language's subject, html and text (the fields of a variant)."""

    subject: _template("subject", template.MAX_SUBJECT, _VARS + "; one line")
    html: _template("html", template.MAX_HTML, _VARS + "; CSS is inlined once")
    text: _template("text", template.MAX_TEXT, _VARS + "; derived from html if absent or null") | None = None


def _variants_size(value: dict) -> dict:
    size = sum(len(v.subject) + len(v.html) + len(v.text or "") for v in value.values())
    if size > MAX_VARIANTS_CHARS:
        raise fail("size", f"must hold at most {MAX_VARIANTS_CHARS} characters in all (subject, html and text)")
    return value


class NewsletterInput(NewsletterVariant):
    from_addr: Annotated[
        Text(template.MAX_FROM, SENDER_PATTERN, message=_FROM_MESSAGE) | None,
        Field(alias="from", description="'addr' or 'Name <addr>'; MAIL_FROM if absent or null"),
        AfterValidator(_sender),
    ] = None
    variants: Annotated[
        dict[LocaleKey, NewsletterVariant],
        Field(
            max_length=MAX_VARIANTS,
            description="the newsletter in other languages, by locale tag (`pt-BR`, `de`): each recipient gets the "
            "variant of their locale, else of its language (a `pt` reader also matches `pt-BR`), else of "
            'DEFAULT_LOCALE\'s chain, else subject/html above (docs/i18n.md, "Newsletters in several languages"); '
            f"at most {MAX_VARIANTS} variants and {MAX_VARIANTS_CHARS} characters in all",
        ),
        BeforeValidator(distinct_locales),
        AfterValidator(_variants_size),
    ] = {}


keyed("variants")


UserIds = Annotated[list[Text(200, min_length=1)], Field(min_length=1, max_length=MAX_AUDIENCE_USER_IDS)]


class UserIdList(Body):
    user_ids: UserIds


_RFC3339 = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
_RFC3339_MESSAGE = "must be an RFC 3339 date-time with a UTC offset, e.g. 2026-03-29T09:00:00+01:00 or ...Z"
_LOCAL_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
_LOCAL_TIME_MESSAGE = 'must be a time of day as HH:MM (24 h), e.g. "09:00"'


def _send_at(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.upper().replace(" ", "T").replace("Z", "+00:00"))
    except ValueError:
        raise fail("send_at", _RFC3339_MESSAGE) from None
    if when.tzinfo is None:  # the pattern requires an offset; kept should the pattern change
        raise fail("send_at", _RFC3339_MESSAGE)
    if when <= datetime.now(UTC):
        raise fail("send_at", "must be in the future (leave it out to send now)")
    return when.astimezone(UTC)


def _local_time(value: str | None) -> time | None:
    return None if value is None else time.fromisoformat(value)


class NewsletterAudience(Body):
    send_at: Annotated[
        Text(40, _RFC3339, message=_RFC3339_MESSAGE) | None,
        Field(
            json_schema_extra={"format": "date-time"},
            description="RFC 3339 with an offset, in the future: the newsletter is `scheduled` until then, and can "
            "be sent again (a new send_at: rescheduled; none: now) or cancelled until it starts; absent or null: now",
        ),
        AfterValidator(_send_at),
    ] = None
    local_time: Annotated[
        Text(5, _LOCAL_TIME, message=_LOCAL_TIME_MESSAGE) | None,
        Field(
            description="HH:MM: each recipient gets it when their own time zone (the subscriber's `timezone`) next "
            "reads this time after the start (send_at, or now): everyone within 24 h, at the same local time"
        ),
        AfterValidator(_local_time),
    ] = None
    respect_quiet_hours: bool = Field(
        False,
        description="hold each recipient's mail while their quiet hours hold it, until the window ends (their "
        "own window, else DEFAULT_QUIET_HOURS); false: it goes whatever the hour. A recipient's mail budget "
        "(max_mails_per_day) holds their mail to their next local day either way",
    )
    audience: (
        Annotated[
            Literal["all"],
            Field(description="every subscriber; unsubscribed/suppressed ones are recorded as suppressed"),
        ]
        | UserIdList
        | Annotated[UserIds, Field(description='shorthand for {"user_ids": [...]}')]
    )

    def recipients(self) -> dict:
        """The audience as request_send stores it: {"kind": "all"}, or {"kind": "user_ids", "user_ids":
        sorted unique ids}."""
        if self.audience == "all":
            return {"kind": "all"}
        ids = self.audience.user_ids if isinstance(self.audience, UserIdList) else self.audience
        return {"kind": "user_ids", "user_ids": sorted(set(ids))}


def validate_new(body) -> tuple[NewsletterInput | None, list[dict]]:
    """The newsletter for create(), or the problems (scripts and tests create from plain values)."""
    return check(NewsletterInput, body)


def create(newsletter: NewsletterInput) -> int:
    stored = {tag: v.model_dump() for tag, v in newsletter.variants.items()}
    fields = (newsletter.subject, newsletter.html, newsletter.text, newsletter.from_addr)
    created = db.call(newsletter_rows.create, *fields, orjson.dumps(stored).decode() if stored else None)
    log.info("newsletter %s created", created)
    return created


def _current(newsletter_id: int) -> tuple:
    rows = db.query(
        "SELECT status, audience, outbox_completed_at, local_time, respect_quiet_hours FROM newsletters WHERE id = %s",
        (newsletter_id,),
    )
    if not rows:
        raise NotFound(NOT_FOUND)
    return rows[0]


def request_send(
    newsletter_id: int,
    audience: dict,
    send_at: datetime | None = None,
    local_time: time | None = None,
    respect_quiet_hours: bool = False,
) -> str:
    """draft (or scheduled) -> queued and the outbox actor enqueued; with a send_at, -> scheduled
    instead (the scheduler tick starts it: app/newsletter/schedule.py). Repeating the same request
    is harmless."""
    stored_audience = orjson.dumps(audience).decode()
    if send_at is not None:
        if db.call(newsletter_rows.schedule, newsletter_id, stored_audience, local_time, send_at, respect_quiet_hours):
            log.info("newsletter %s scheduled for %s", newsletter_id, send_at.isoformat())
            return "scheduled"
        status = _current(newsletter_id)[0]
        raise Conflict(f"only a draft or scheduled newsletter can be scheduled (it is {status})", status)
    queued = db.call(newsletter_rows.queue, newsletter_id, stored_audience, local_time, respect_quiet_hours)
    if not queued:
        status, stored, outbox_done, stored_time, stored_respect = _current(newsletter_id)
        if status in ("done", "cancelled"):
            raise Conflict(f"newsletter is {status}; create a new one to send again", status)
        if not _same_audience(stored, audience):
            raise Conflict(f"newsletter is already {status} with a different audience", status)
        if stored_time != local_time:
            raise Conflict(f"newsletter is already {status} with a different local_time", status)
        if stored_respect != respect_quiet_hours:
            raise Conflict(f"newsletter is already {status} with a different respect_quiet_hours", status)
        if outbox_done is not None:
            return status
    _kick_safely(kick.outbox, newsletter_id)
    return "queued" if queued else status


def _same_audience(stored: dict | None, requested: dict) -> bool:
    """Whether a repeated send request names the stored audience: the same, or the same less
    user_ids erased since (an erasure removes its user_id from every audience, app/subscribers/records.py)."""
    if stored == requested:
        return True
    stored = stored or {}
    if stored.get("kind") != "user_ids" or requested.get("kind") != "user_ids":
        return False
    kept, asked = set(stored.get("user_ids", [])), set(requested.get("user_ids", []))
    gone = sorted(asked - kept)
    return kept < asked and not db.query("SELECT 1 FROM subscribers WHERE user_id = ANY(%s) LIMIT 1", (gone,))


def unknown_user_ids(audience: dict) -> tuple[list[str], int]:
    """The audience's user_ids that are no subscriber: they get no outbox row, so the send answer
    names them (the first UNKNOWN_SHOWN, sorted) and counts them all rather than dropping them
    silently."""
    if audience.get("kind") != "user_ids":
        return [], 0
    wanted = audience.get("user_ids", [])
    known = {r[0] for r in db.query("SELECT user_id FROM subscribers WHERE user_id = ANY(%s)", (wanted,))}
    unknown = [u for u in wanted if u not in known]  # wanted is sorted (NewsletterAudience.recipients)
    return unknown[:UNKNOWN_SHOWN], len(unknown)


def _kick_safely(fn, newsletter_id: int, *args) -> None:
    """The row is the truth: if Redis is down now, the scheduler tick's reclaim_stale re-kicks."""
    try:
        fn(newsletter_id, *args)
    except Exception as exc:
        log.error("newsletter %s: enqueue failed (%s); the next scheduler tick will retry", newsletter_id, exc)


def pause(newsletter_id: int) -> str:
    if db.call(newsletter_rows.pause, newsletter_id):
        log.info("newsletter %s paused", newsletter_id)
        return "paused"
    status = _current(newsletter_id)[0]
    if status == "paused":
        return status
    if status == "scheduled":
        raise Conflict(
            "a scheduled newsletter has not started: cancel it, or send it again with another send_at", status
        )
    raise Conflict(f"only a queued or sending newsletter can be paused (it is {status})", status)


def resume(newsletter_id: int) -> str:
    resumed, outbox_done = db.call(newsletter_rows.resume, newsletter_id)
    if not resumed:
        status = _current(newsletter_id)[0]
        if status in ("queued", "sending"):
            return status
        raise Conflict(f"only a paused newsletter can be resumed (it is {status})", status)
    log.info("newsletter %s resumed", newsletter_id)
    if not outbox_done:
        _kick_safely(kick.outbox, newsletter_id)
    _kick_safely(kick.send_chains, newsletter_id)
    return "sending"


def cancel(newsletter_id: int) -> Cancelled:
    """No new claims from now on; rows not yet claimed become `cancelled`. A send loop holding
    claimed rows stops between two mails within a second (app/newsletter/sender.py): the mails in
    flight finish, the rows it did not start become `cancelled` too."""
    if not db.call(newsletter_rows.cancel, newsletter_id):
        status = _current(newsletter_id)[0]
        if status != "cancelled":
            raise Conflict("a finished newsletter cannot be cancelled", status)
    cancelled = outbox.cancel_pending_rows(newsletter_id)
    log.info("newsletter %s cancelled (%d pending rows)", newsletter_id, cancelled)
    return Cancelled(id=newsletter_id, status="cancelled", cancelled_rows=cancelled)


def retry_failed(newsletter_id: int) -> Requeued:
    status = _current(newsletter_id)[0]
    if status not in ("sending", "paused", "done"):
        raise Conflict(f"failed rows can be retried while sending, paused or done (it is {status})", status)
    with db.raw_cursor() as cur:
        requeued = newsletter_rows.retry_failed(cur, newsletter_id)
    status = _current(newsletter_id)[0]
    if requeued and status == "sending":
        _kick_safely(kick.send_chains, newsletter_id)
    log.info("newsletter %s: %d failed row(s) requeued", newsletter_id, requeued)
    return Requeued(id=newsletter_id, status=status, requeued=requeued)


LIST_MAX = 100


class NewsletterListQuery(Body):
    """GET /v1/newsletters query: newest first, keyset-paginated by id."""

    model_config = {**Body.model_config, "strict": False}  # query values arrive as text
    limit: Annotated[int, Field(ge=1, le=LIST_MAX, description="newsletters per page")] = 20
    before: Annotated[
        int | None, Field(ge=1, le=2**63 - 1, description="only ids below this (the previous page's `next_before`)")
    ] = None
    status: Literal[STATUSES] | None = None


def list_newsletters(query: NewsletterListQuery) -> NewsletterPage:
    """One page, newest first, with row counts: a finished newsletter's were stored when it finished;
    the others (few at any time) are counted now."""
    found = db.query(
        f"SELECT {_SHOWN}, final_counts FROM newsletters WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint) "
        "AND (%(status)s::text IS NULL OR status = %(status)s::text) ORDER BY id DESC LIMIT %(limit)s",
        {"before": query.before, "status": query.status, "limit": query.limit + 1},
    )
    page, more = found[: query.limit], len(found) > query.limit
    live = [r[0] for r in page if r[-1] is None and r[2] != "draft"]
    counted: dict[int, dict] = {}
    if live:
        for nid, row_status, n in db.query(
            "SELECT newsletter_id, status, count(*) FROM email_log WHERE newsletter_id = ANY(%s) GROUP BY 1, 2", (live,)
        ):
            counted.setdefault(nid, {})[row_status] = n
    items = []
    for *shown, final in page:
        counts = final if final is not None else counted.get(shown[0], {})
        items.append(NewsletterSummary(**_shown_fields(shown, counts)))
    return NewsletterPage(newsletters=items, next_before=page[-1][0] if more else None)


# What a list item and a status both show of a newsletter: these columns, in this order (the
# variants' tags only: their subjects and bodies stay in the table).
_SHOWN = (
    "id, subject, status, audience, created_at, send_requested_at, send_at, started_at, local_time, "
    "respect_quiet_hours, completed_at, "
    "ARRAY(SELECT k FROM jsonb_object_keys(coalesce(variants, '{}'::jsonb)) k ORDER BY k)"
)


def _shown_fields(row, counts: dict[str, int]) -> dict[str, Any]:
    """The fields of NewsletterSummary from a row of _SHOWN and the outbox's counts by status."""
    nid, subject, state, audience, created, requested, send_at, started, local_time, respect, completed, locales = row
    counted = {**dict.fromkeys(ROW_STATUSES, 0), **counts}
    counted["total"] = sum(counted[s] for s in ROW_STATUSES)
    return {
        "id": nid,
        "subject": subject,
        "status": state,
        "audience": _audience_summary(audience),
        "created_at": created,
        "send_requested_at": requested,
        "send_at": send_at,
        "started_at": started,
        "local_time": _hhmm(local_time),
        "respect_quiet_hours": respect,
        "completed_at": completed,
        "counts": RowCounts(**counted),
        "variant_locales": list(locales or []),
    }


def newsletter_status(newsletter_id: int) -> NewsletterStatus:
    rows = db.query(f"SELECT {_SHOWN}, from_addr, outbox_completed_at FROM newsletters WHERE id = %s", (newsletter_id,))
    if not rows:
        raise NotFound(NOT_FOUND)
    *shown, from_addr, outbox_done = rows[0]
    by_variant = db.query(
        "SELECT status, variant, count(*) FROM email_log WHERE newsletter_id = %s GROUP BY status, variant",
        (newsletter_id,),
    )
    counts: dict[str, int] = {}
    for status, _, n in by_variant:
        counts[status] = counts.get(status, 0) + n
    return NewsletterStatus(
        **_shown_fields(shown, counts),
        **{"from": from_addr},
        outbox_completed_at=outbox_done,
        **engagement(newsletter_id),
        variants=variant_counts(newsletter_id, list(shown[-1] or []), by_variant),
    )


def variant_counts(newsletter_id: int, tags: list[str], by_variant: list[tuple]) -> list[VariantCounts]:
    """Recipients, sent, unique human openers and clickers of each variant (the default first): the
    variant is the one the outbox stored on each recipient's row (app/newsletter/variants.py)."""
    shown: dict[str | None, dict[str, int]] = {
        v: {"recipients": 0, "sent": 0, "opened": 0, "clicked": 0} for v in [None, *tags]
    }
    for status, variant, n in by_variant:
        counted = shown.setdefault(variant, {"recipients": 0, "sent": 0, "opened": 0, "clicked": 0})
        counted["recipients"] += n
        if status == "sent":
            counted["sent"] += n
    for variant, kind, people in db.query(
        "SELECT e.variant, h.kind, count(DISTINCT h.subscriber_id) FROM email_link_history h "
        "JOIN email_log e ON e.newsletter_id = h.mail_id AND e.subscriber_id = h.subscriber_id "
        "WHERE h.mail_kind = 'newsletter' AND h.mail_id = %s AND NOT h.is_machine GROUP BY 1, 2",
        (newsletter_id,),
    ):
        counted = shown.setdefault(variant, {"recipients": 0, "sent": 0, "opened": 0, "clicked": 0})
        counted["opened" if kind == "open" else "clicked"] = people
    order = sorted(shown, key=lambda v: (v is not None, v or ""))
    return [VariantCounts(locale=v, **shown[v]) for v in order]


def engagement(newsletter_id: int) -> dict[str, Any]:
    """Opens/clicks (machine = scanners/prefetch) and applied SendGrid events, from tracking's stats:
    NewsletterStatus's opens, clicks, bounces and unsubscribes."""
    stats = mail_stats("newsletter", newsletter_id)
    out: dict[str, Any] = {
        kind: Engagement(
            total=stats[kind]["human"] + stats[kind]["machine"],
            human=stats[kind]["human"],
            machine=stats[kind]["machine"],
            unique_human=stats[kind]["unique_human"],
        )
        for kind in ("opens", "clicks")
    }
    events = stats["events"]
    out["bounces"] = sum(events.get(e, 0) for e in BOUNCE_EVENTS)
    out["unsubscribes"] = sum(events.get(e, 0) for e in UNSUBSCRIBE_EVENTS)
    return out


def _audience_summary(audience: dict | None) -> AudienceSummary | None:
    if not audience:
        return None
    if audience.get("kind") == "user_ids":
        return AudienceSummary(kind="user_ids", count=len(audience.get("user_ids", [])))
    return AudienceSummary(**audience)


def _hhmm(value: time | None) -> str | None:
    return value.strftime("%H:%M") if value is not None else None
