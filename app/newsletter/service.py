"""Newsletter operations behind the admin API and the CLI: create, send, pause, resume, cancel,
retry failed rows, and status with counts. Every state change is one conditional UPDATE, so two
operators (or a retried request) racing each other cannot produce an impossible state."""
from __future__ import annotations

import logging
import re

import orjson

from app import db, mail
from app.newsletter import kick, outbox, template
from app.newsletter import rows as statements
from tracking.stats import mail_stats

log = logging.getLogger("app.newsletter.service")

MAX_AUDIENCE_USER_IDS = 10_000
FIELDS = ("subject", "html", "text", "from")
ROW_STATUSES = ("pending", "sending", "sent", "failed", "suppressed", "cancelled")
# Applied SendGrid events (mail_event_counts) that count as a bounce / an unsubscribe.
BOUNCE_EVENTS = ("bounce", "dropped", "blocked")
UNSUBSCRIBE_EVENTS = ("unsubscribe", "group_unsubscribe", "spamreport")


class NotFound(Exception):
    pass


class Conflict(Exception):
    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


# The sender: "addr" or "Name <addr>" — exactly one mailbox, so the name has none of RFC 5322's
# specials and the address is plain ASCII (it goes in every envelope). Shared with the OpenAPI
# document, so the documented pattern is exactly what is accepted.
_SENDER_ADDR = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
_SENDER_NAME = r"[^<>()\[\]:;@\\,.\"\x00-\x1f\x7f]*"
SENDER_PATTERN = rf"^(?:{_SENDER_ADDR}|{_SENDER_NAME}<{_SENDER_ADDR}>)$"
_SENDER_RE = re.compile(SENDER_PATTERN[1:-1])
_TEMPLATE_HELP = (
    "is not a supported template: Mustache tags allowed are {{var}}, {{{var}}}, {{&var}}, {{! comment }}, "
    "{{#var}}...{{/var}} and {{^var}}...{{/var}} (nested at most %d deep; {{.}} only inside a section); "
    "a literal '{' must not start '{{'; variables: %s" % (template.SECTION_DEPTH, ", ".join(template.VARIABLES)))


def _one_mailbox(value: str) -> bool:
    try:
        mail.parse_mailbox(value.strip())
        return True
    except mail.MailBuildError:
        return False


def validate_new(body) -> tuple[dict, list[dict]]:
    if not isinstance(body, dict):
        return {}, [{"field": "body", "message": "expected a JSON object"}]
    errors = [{"field": k, "message": "unknown field"} for k in sorted(set(body) - set(FIELDS))]
    values: dict = {}
    limits = {"subject": template.MAX_SUBJECT, "html": template.MAX_HTML, "text": template.MAX_TEXT}
    for field in ("subject", "html", "text"):
        value = body.get(field)
        if value is None:
            if field != "text":
                errors.append({"field": field, "message": "is required"})
            continue
        if not isinstance(value, str) or not value.strip():
            errors.append({"field": field, "message": "must be a non-empty string"})
        elif len(value) > limits[field]:
            errors.append({"field": field, "message": f"must be at most {limits[field]} characters"})
        elif "\x00" in value:
            errors.append({"field": field, "message": "must not contain NUL characters"})
        elif field == "subject" and ("\n" in value or "\r" in value):
            errors.append({"field": field, "message": "must be a single line"})
        elif not template.matches_grammar(field, value):
            # The grammar (documented as the field's pattern) is the rule; chevron's own checks
            # only explain the common mistakes more precisely.
            errors.extend(template.check(field, value) or [{"field": field, "message": _TEMPLATE_HELP}])
        else:
            values[field] = value
    sender = body.get("from")
    if sender is not None:
        if not isinstance(sender, str) or len(sender) > template.MAX_FROM or not _SENDER_RE.fullmatch(sender) \
                or not _one_mailbox(sender):
            errors.append({"field": "from", "message": "must be exactly one address like 'News <news@example.com>'"})
        else:
            values["from_addr"] = sender.strip()
    return values, errors


def validate_audience(body) -> tuple[dict | None, list[dict]]:
    """{"audience": "all"} (every subscriber; unsubscribed/suppressed are recorded as suppressed)
    or {"audience": {"user_ids": [...]}} (at most MAX_AUDIENCE_USER_IDS)."""
    if not isinstance(body, dict):
        return None, [{"field": "body", "message": "expected a JSON object"}]
    unknown = sorted(set(body) - {"audience"})
    if unknown:
        return None, [{"field": k, "message": "unknown field"} for k in unknown]
    audience = body.get("audience")
    if audience == "all":
        return {"kind": "all"}, []
    if isinstance(audience, list):
        audience = {"user_ids": audience}
    if isinstance(audience, dict) and set(audience) == {"user_ids"}:
        ids = audience["user_ids"]
        if not isinstance(ids, list) or not ids:
            return None, [{"field": "audience.user_ids", "message": "must be a non-empty list"}]
        if len(ids) > MAX_AUDIENCE_USER_IDS:
            return None, [{"field": "audience.user_ids",
                           "message": f"at most {MAX_AUDIENCE_USER_IDS} user_ids per send; use \"all\""}]
        if not all(isinstance(u, str) and 0 < len(u) <= 200 and "\x00" not in u for u in ids):
            return None, [{"field": "audience.user_ids",
                           "message": "must be strings of 1-200 characters without NUL"}]
        return {"kind": "user_ids", "user_ids": sorted(set(ids))}, []
    return None, [{"field": "audience", "message": "must be \"all\" or {\"user_ids\": [...]}"}]


def create(values: dict) -> int:
    created = db.query(statements.CREATE, (values["subject"], values["html"], values.get("text"), values.get("from_addr")))
    log.info("newsletter %s created", created[0][0])
    return created[0][0]


def _current(newsletter_id: int) -> tuple:
    rows = db.query("SELECT status, audience, outbox_completed_at FROM newsletters WHERE id = %s",
                    (newsletter_id,))
    if not rows:
        raise NotFound(f"no newsletter {newsletter_id}")
    return rows[0]


def request_send(newsletter_id: int, audience: dict) -> str:
    """draft -> queued and the outbox actor enqueued. Repeating the same request is harmless."""
    rows = db.query(statements.QUEUE, (orjson.dumps(audience).decode(), newsletter_id))
    if not rows:
        status, stored, outbox_done = _current(newsletter_id)
        if status in ("done", "cancelled"):
            raise Conflict(f"newsletter is {status}; create a new one to send again", status)
        if stored != audience:
            raise Conflict(f"newsletter is already {status} with a different audience", status)
        if outbox_done is not None:
            return status
    _kick_safely(kick.outbox, newsletter_id)
    return rows[0][0] if rows else status


def _kick_safely(fn, newsletter_id: int, *args) -> None:
    """The row is the truth: if Redis is down now, the scheduler tick's reclaim_stale re-kicks."""
    try:
        fn(newsletter_id, *args)
    except Exception as exc:
        log.error("newsletter %s: enqueue failed (%s); the next scheduler tick will retry", newsletter_id, exc)


def pause(newsletter_id: int) -> str:
    rows = db.query(statements.PAUSE, (newsletter_id,))
    if rows:
        log.info("newsletter %s paused", newsletter_id)
        return "paused"
    status = _current(newsletter_id)[0]
    if status == "paused":
        return status
    raise Conflict(f"only a queued or sending newsletter can be paused (it is {status})", status)


def resume(newsletter_id: int) -> str:
    rows = db.query(statements.RESUME, (newsletter_id,))
    if not rows:
        status = _current(newsletter_id)[0]
        if status in ("queued", "sending"):
            return status
        raise Conflict(f"only a paused newsletter can be resumed (it is {status})", status)
    log.info("newsletter %s resumed", newsletter_id)
    if rows[0][0] is None:
        _kick_safely(kick.outbox, newsletter_id)
    _kick_safely(kick.send_chains, newsletter_id)
    return "sending"


def cancel(newsletter_id: int) -> dict:
    """No new claims from now on; rows not yet claimed become `cancelled`. Rows a worker already
    holds finish (they may be at the provider already)."""
    rows = db.query(statements.CANCEL, (newsletter_id,))
    if not rows:
        status = _current(newsletter_id)[0]
        if status != "cancelled":
            raise Conflict("a finished newsletter cannot be cancelled", status)
    cancelled = outbox.cancel_pending_rows(newsletter_id)
    log.info("newsletter %s cancelled (%d pending rows)", newsletter_id, cancelled)
    return {"status": "cancelled", "cancelled_rows": cancelled}


def retry_failed(newsletter_id: int) -> dict:
    status = _current(newsletter_id)[0]
    if status not in ("sending", "paused", "done"):
        raise Conflict(f"failed rows can be retried while sending, paused or done (it is {status})", status)
    with db.database.connection_context(), db.database.atomic():
        cur = db.database.execute_sql(statements.RETRY_FAILED, (newsletter_id,))
        requeued = cur.rowcount
        if requeued:
            db.database.execute_sql(statements.REOPEN, (newsletter_id,))
    status = _current(newsletter_id)[0]
    if requeued and status == "sending":
        _kick_safely(kick.send_chains, newsletter_id)
    log.info("newsletter %s: %d failed row(s) requeued", newsletter_id, requeued)
    return {"status": status, "requeued": requeued}


def status(newsletter_id: int) -> dict:
    rows = db.query(
        "SELECT id, subject, from_addr, status, audience, created_at, send_requested_at, "
        "outbox_completed_at, completed_at FROM newsletters WHERE id = %s", (newsletter_id,))
    if not rows:
        raise NotFound(f"no newsletter {newsletter_id}")
    (nid, subject, from_addr, state, audience, created, requested, outbox_done, completed) = rows[0]
    counts = dict.fromkeys(ROW_STATUSES, 0)
    for row_status, n in db.query("SELECT status, count(*) FROM email_log WHERE newsletter_id = %s "
                                  "GROUP BY status", (newsletter_id,)):
        counts[row_status] = n
    counts["total"] = sum(counts.values())
    result = {
        "id": nid, "subject": subject, "from": from_addr, "status": state,
        "audience": _audience_summary(audience),
        "created_at": _iso(created), "send_requested_at": _iso(requested),
        "outbox_completed_at": _iso(outbox_done), "completed_at": _iso(completed),
        "counts": counts,
    }
    result.update(engagement(newsletter_id))
    return result


def engagement(newsletter_id: int) -> dict:
    """Opens/clicks (machine = scanners/prefetch) and applied SendGrid events, from tracking's stats."""
    stats = mail_stats("newsletter", newsletter_id)
    out = {kind: {"total": stats[kind]["human"] + stats[kind]["machine"], "human": stats[kind]["human"],
                  "machine": stats[kind]["machine"], "unique_human": stats[kind]["unique_human"]}
           for kind in ("opens", "clicks")}
    events = stats["events"]
    out["bounces"] = sum(events.get(e, 0) for e in BOUNCE_EVENTS)
    out["unsubscribes"] = sum(events.get(e, 0) for e in UNSUBSCRIBE_EVENTS)
    return out


def _audience_summary(audience):
    if not audience:
        return None
    if audience.get("kind") == "user_ids":
        return {"kind": "user_ids", "count": len(audience.get("user_ids", []))}
    return audience


def _iso(value):
    return value.isoformat() if value is not None else None
