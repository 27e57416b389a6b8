"""newsletters and email_log: the one owner of both state machines.

Every write to these two tables is a named statement here; the modules around it (service,
outbox, sender, reclaim) decide when, this module decides how.

Life of a newsletter (newsletters.status):
  (new)                     --create-----------------------------> draft
  draft, scheduled          --send requested---------------------> queued
  draft, scheduled          --send requested with a send_at------> scheduled   (rescheduled)
  scheduled                 --send_at came (scheduler tick)------> queued
  queued                    --outbox builder starts--------------> sending
  queued, sending           --pause------------------------------> paused
  paused                    --resume-----------------------------> sending
  sending                   --nothing pending or sending left----> done
  done                      --retry-failed requeued rows---------> sending
  draft, scheduled, queued, sending, paused --cancel-------------> cancelled

Life of an outbox row (email_log.status):
  (new)      --outbox: subscribed------------------------> pending
  (new)      --outbox: unsubscribed (everything or the
               newsletter stream) or suppressed-----------> suppressed
  pending    --claim (attempt counted; not before its
               not_before, the recipient's local_time)----> sending
  pending    --claim: unsubscribed/suppressed since-------> suppressed  (newsletter stream too)
  sending    --provider accepted--------------------------> sent
  sending    --refused, or attempts used up---------------> failed      (error kept)
  sending    --retryable failure, throttled---------------> pending     (backoff; a throttle refunds the attempt)
  sending    --stuck past RECLAIM_AFTER_SECONDS-----------> pending     (the claim counted the attempt)
  sending    --not started: paused, all mail stopped------> pending     (the claim's attempt refunded)
  sending    --must wait: quiet hours, the day's budget---> pending     (until then: not_before; attempt refunded)
  sending    --not started: newsletter cancelled----------> cancelled
  pending    --newsletter cancelled-----------------------> cancelled
  failed     --retry-failed-------------------------------> pending     (attempts start again)

tests/newsletter/test_rows.py walks every transition and checks no statement makes any other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, time
from typing import Any, NamedTuple

from app.platform import db
from app.platform.mail_stop import NOT_ENGAGED
from app.subscribers import mailable
from app.subscribers.streams import NEWSLETTERS


class NewsletterStatus(enum.StrEnum):
    DRAFT = "draft"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    SENDING = "sending"
    PAUSED = "paused"
    DONE = "done"
    CANCELLED = "cancelled"


class RowStatus(enum.StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    SUPPRESSED = "suppressed"
    CANCELLED = "cancelled"


def _transitions(moves: Mapping[Any, tuple[Any, ...]]) -> frozenset[tuple[Any, Any]]:
    """The (from, to) pairs of {from: (to, …)}."""
    return frozenset((before, after) for before, afters in moves.items() for after in afters)


_N = NewsletterStatus
NEWSLETTER_TRANSITIONS = _transitions(
    {
        None: (_N.DRAFT,),
        _N.DRAFT: (_N.QUEUED, _N.SCHEDULED, _N.CANCELLED),
        _N.SCHEDULED: (_N.QUEUED, _N.CANCELLED),
        _N.QUEUED: (_N.SENDING, _N.PAUSED, _N.CANCELLED),
        _N.SENDING: (_N.PAUSED, _N.DONE, _N.CANCELLED),
        _N.PAUSED: (_N.SENDING, _N.CANCELLED),
        _N.DONE: (_N.SENDING,),
    }
)
_R = RowStatus
ROW_TRANSITIONS = _transitions(
    {
        None: (_R.PENDING, _R.SUPPRESSED),
        _R.PENDING: (_R.SENDING, _R.SUPPRESSED, _R.CANCELLED),
        _R.SENDING: (_R.SENT, _R.FAILED, _R.PENDING, _R.CANCELLED),
        _R.FAILED: (_R.PENDING,),
    }
)

# -- newsletters -------------------------------------------------------------------------------
CREATE = (
    "INSERT INTO newsletters (subject, html, text, from_addr, variants) VALUES (%s, %s, %s, %s, %s::jsonb) RETURNING id"
)
# Params: (audience, local_time, id); SCHEDULE's: (audience, local_time, send_at, id). A scheduled
# newsletter is changed whole by a new request (audience, time), until the tick starts it.
QUEUE = (
    "UPDATE newsletters SET status = 'queued', audience = %s, local_time = %s, respect_quiet_hours = %s, "
    "send_at = NULL, send_requested_at = now(), started_at = now() "
    "WHERE id = %s AND status IN ('draft', 'scheduled') RETURNING status"
)
SCHEDULE = (
    "UPDATE newsletters SET status = 'scheduled', audience = %s, local_time = %s, respect_quiet_hours = %s, "
    "send_at = %s, send_requested_at = now() WHERE id = %s AND status IN ('draft', 'scheduled') RETURNING status"
)
# send_at stays: what the newsletter was scheduled for, beside when it started (started_at).
START_SCHEDULED = (
    "UPDATE newsletters SET status = 'queued', started_at = now() "
    "WHERE status = 'scheduled' AND send_at <= now() RETURNING id"
)
START_SENDING = "UPDATE newsletters SET status = 'sending' WHERE id = %s AND status = 'queued'"
OUTBOX_COMPLETE = "UPDATE newsletters SET outbox_completed_at = now() WHERE id = %s AND outbox_completed_at IS NULL"
PAUSE = "UPDATE newsletters SET status = 'paused' WHERE id = %s AND status IN ('queued', 'sending') RETURNING status"
RESUME = "UPDATE newsletters SET status = 'sending' WHERE id = %s AND status = 'paused' RETURNING outbox_completed_at"
CANCEL = (
    "UPDATE newsletters SET status = 'cancelled', completed_at = now() "
    "WHERE id = %s AND status NOT IN ('done', 'cancelled') RETURNING id"
)
REOPEN = (
    "UPDATE newsletters SET status = 'sending', completed_at = NULL, final_counts = NULL "
    "WHERE id = %s AND status = 'done'"
)
# One newsletter (%(nl)s) or, with NULL, every one whose last rows a dead worker finished.
DONE = """
UPDATE newsletters n SET status = 'done', completed_at = now(),
    final_counts = (SELECT jsonb_object_agg(c.status, c.n) FROM (
        SELECT status, count(*) AS n FROM email_log WHERE newsletter_id = n.id GROUP BY status) c)
WHERE n.status = 'sending' AND n.outbox_completed_at IS NOT NULL
  AND (%(nl)s::bigint IS NULL OR n.id = %(nl)s::bigint)
  AND NOT EXISTS (SELECT 1 FROM email_log e WHERE e.newsletter_id = n.id AND e.status IN ('pending', 'sending'))
RETURNING n.id
"""

# -- email_log ---------------------------------------------------------------------------------
# not_before: the moment the subscriber's zone reaches the newsletter's local_time, computed per zone
# by app/newsletter/schedule.py (zoneinfo, as digest slots) and passed as two arrays (a zone not in
# them, written around the API's check: as UTC); NULL (due at once) without a local_time.
# NO_LOCAL_TIME: the parameters for that.
# variant: the variant each recipient gets (app/newsletter/variants.py `parameters`: by the
# subscriber's locale, then its language, else variant_default; NULL: the default).
NO_LOCAL_TIME: dict[str, list[object] | None] = {"zones": [], "due": [], "default_due": None}
NO_VARIANTS: dict[str, Any] = {"variant_keys": [], "variant_values": [], "variant_default": None}
_REFUSAL = mailable.refusal(NEWSLETTERS)
_ROW_VALUES = f"""
    SELECT %(nl)s, s.id, s.email, coalesce(z.due, %(default_due)s::timestamptz),
           CASE WHEN {_REFUSAL} IS NULL THEN 'pending' ELSE 'suppressed' END, {_REFUSAL},
           coalesce(vt.variant, vl.variant, %(variant_default)s::text)
    FROM subscribers s
    LEFT JOIN unnest(%(zones)s::text[], %(due)s::timestamptz[]) AS z(zone, due) ON z.zone = s.timezone
    LEFT JOIN unnest(%(variant_keys)s::text[], %(variant_values)s::text[]) AS vt(key, variant) ON vt.key = s.locale
    LEFT JOIN unnest(%(variant_keys)s::text[], %(variant_values)s::text[]) AS vl(key, variant)
           ON vl.key = split_part(s.locale, '-', 1)
"""
INSERT_RANGE = (
    "INSERT INTO email_log (newsletter_id, subscriber_id, email, not_before, status, error, variant)"
    + _ROW_VALUES
    + "WHERE s.id > %(lo)s AND s.id <= %(hi)s ON CONFLICT (newsletter_id, subscriber_id) DO NOTHING"
)
INSERT_USER_IDS = (
    "INSERT INTO email_log (newsletter_id, subscriber_id, email, not_before, status, error, variant)"
    + _ROW_VALUES
    + "WHERE s.user_id = ANY(%(user_ids)s) ON CONFLICT (newsletter_id, subscriber_id) DO NOTHING"
)

# One statement = one transaction: pick due rows (backoff over, the recipient's local time come) of
# a newsletter that is `sending` while mail may go out (so a pause or the emergency stop stops
# claims immediately), lock them without waiting for
# rows other workers hold, and move them to `sending` — or straight to `suppressed` if the
# subscriber unsubscribed or got suppressed since the outbox was built (I6: checked at claim
# time). `after`: the send loop's cursor (the largest id it claimed last), so a claim starts
# where the previous one ended instead of stepping over every index entry already claimed or sent
# (thousands of dead entries at the front of the pending index would slow every claim of a big
# send). A loop ends only when a claim from 0 finds nothing, so rows left behind (locked by a
# peer, backoff now due) are never missed.
_REFUSAL_AT_SEND = mailable.refusal(NEWSLETTERS, when=" before send")
CLAIM = (
    """
WITH picked AS (
    SELECT e.id FROM email_log e
    WHERE e.newsletter_id = %(nl)s AND e.status = 'pending' AND e.id > %(after)s
      AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
      AND (e.not_before IS NULL OR e.not_before <= now())
      AND EXISTS (SELECT 1 FROM newsletters n WHERE n.id = %(nl)s AND n.status = 'sending')
      AND """
    + NOT_ENGAGED
    + """
    ORDER BY e.id
    LIMIT %(limit)s
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE email_log e SET
    status = CASE WHEN """
    + _REFUSAL_AT_SEND
    + """ IS NULL THEN 'sending' ELSE 'suppressed' END,
    error = coalesce("""
    + _REFUSAL_AT_SEND
    + """, e.error),
    attempts = e.attempts + 1,
    claimed_at = now(),
    email = s.email
FROM picked p, subscribers s
WHERE e.id = p.id AND s.id = e.subscriber_id
RETURNING e.id, e.status, e.attempts, s.id, s.email, s.name, s.user_id, s.token_version, s.tracking_opt_out,
          e.provider, e.variant, s.locale, s.timezone, s.quiet_hours, s.max_mails_per_day
"""
)

# The outcome of a sent batch: (id, status, message_id, error, next_attempt_at, refund, provider) per row,
# only for rows still `sending` (a reclaimed row is not marked by the worker that lost it).
# `e.status || ''`: not a condition the partial index email_log_sending_idx can serve. Written
# plainly, the planner — whose statistics come from the outbox builder's ANALYZE, taken while no row
# was `sending` — expects one sending row, scans that index and compares every sending row with
# every VALUES row, which grows with the square of the batch. This way the VALUES drive the join
# through the primary key (tests/newsletter/test_rows.py checks the plan; docs/history.md, the cost).
MARK = """
UPDATE email_log e SET
    status = v.status,
    sent_at = CASE WHEN v.status = 'sent' THEN now() ELSE e.sent_at END,
    provider_message_id = coalesce(v.message_id, e.provider_message_id),
    provider = coalesce(v.provider, e.provider),
    error = v.error,
    next_attempt_at = v.next_attempt_at,
    attempts = e.attempts - v.refund
FROM (VALUES %s) AS v(id, status, message_id, error, next_attempt_at, refund, provider)
WHERE e.id = v.id AND e.status || '' = 'sending' AND v.status IN ('sent', 'failed', 'pending')
"""
MARK_TEMPLATE = "(%s::bigint, %s::text, %s::text, %s::text, %s::timestamptz, %s::int, %s::text)"

# Checked by a send loop between two mails (at least every mail_stop.SEND_CHECK_SECONDS): may it
# go on? (status, whether all mail is stopped).
MAY_SEND = "SELECT status, " + NOT_ENGAGED + " FROM newsletters WHERE id = %s"

# Rows a send loop claimed and did not start because it was asked to stop: back to `pending` with
# the claim's attempt refunded (a pause is not the row's fault), or `cancelled` with the newsletter.
# `e.status || ''`: as in MARK.
RELEASE = """
UPDATE email_log e SET
    status = CASE WHEN n.status = 'cancelled' THEN 'cancelled' ELSE 'pending' END,
    error = CASE WHEN n.status = 'cancelled' THEN 'newsletter cancelled' ELSE e.error END,
    attempts = e.attempts - 1
FROM newsletters n
WHERE e.id = ANY (%s) AND e.status || '' = 'sending' AND n.id = e.newsletter_id
"""

# Claimed rows that must wait (app/newsletter/waits.py: the recipient's quiet hours, or their day's
# mail budget is spent): back to `pending`, due at `until` (not_before, as a local_time send's rows;
# next_attempt_at too, so the tick's "due rows" check passes over them), the claim's attempt refunded.
DEFER = """
UPDATE email_log e SET status = 'pending', not_before = v.until, next_attempt_at = v.until,
    attempts = e.attempts - 1
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, until)
WHERE e.id = v.id AND e.status || '' = 'sending'
"""

RECLAIM = """
UPDATE email_log SET status = 'pending', next_attempt_at = NULL,
       error = 'reclaimed: claimed or last renewed at ' || claimed_at || ' and never marked (worker died?)'
WHERE status = 'sending' AND claimed_at < now() - make_interval(secs => %s)
RETURNING newsletter_id
"""

# A live holder's claim, renewed (app/platform/holds.py): rows being marked right now are skipped, so
# the renewal never waits for (or deadlocks with) the holder's own writes.
RENEW = """
UPDATE email_log SET claimed_at = now() WHERE id IN (
    SELECT id FROM email_log WHERE id = ANY (%s::bigint[]) AND status = 'sending' ORDER BY id FOR UPDATE SKIP LOCKED)
"""

# pending → cancelled in chunks, each its own short transaction (see outbox.cancel_pending_rows).
CANCEL_PENDING_CHUNK = """
UPDATE email_log SET status = 'cancelled', error = 'newsletter cancelled' WHERE id IN (
    SELECT id FROM email_log WHERE newsletter_id = %s AND status = 'pending' LIMIT %s FOR UPDATE SKIP LOCKED)
"""

RETRY_FAILED = """
UPDATE email_log SET status = 'pending', attempts = 0, next_attempt_at = NULL,
       error = 'retry requested after: ' || coalesce(error, '')
WHERE newsletter_id = %s AND status = 'failed'
"""


# -- the transitions, one function each (every write of the two tables goes through one) ----------
class Claimed(NamedTuple):
    """An outbox row as a claim returns it, with what rendering needs of its subscriber."""

    id: int
    status: str  # 'sending', or 'suppressed' when the recipient may no longer be mailed
    attempts: int
    subscriber_id: int
    email: str
    name: str | None
    user_id: str
    token_version: int
    tracking_opt_out: bool
    provider: str | None = None  # set: an ambiguous attempt there; only that provider may send it
    variant: str | None = None  # the variant the outbox chose (its locale tag); None: the default
    locale: str | None = None  # the subscriber's
    timezone: str = "UTC"  # the subscriber's, for their quiet hours and local day
    quiet_hours: str | None = None  # their window ("22:00-07:00"; None: DEFAULT_QUIET_HOURS)
    max_mails_per_day: int | None = None  # their budget (None: DEFAULT_MAX_MAILS_PER_DAY)


class Mark(NamedTuple):
    """The outcome of one row a send loop sent (or tried to)."""

    id: int
    status: str  # 'sent', 'failed' or 'pending' (retried after next_attempt_at)
    message_id: str | None
    error: str | None
    next_attempt_at: datetime | None
    refund: int  # 1: the claim's attempt does not count (a throttle is not the row's fault)
    # 'sent': who accepted it; 'pending': whose answer never came (ambiguous) — the row's retries go
    # there alone, and a later mark naming none keeps it
    provider: str | None = None


def create(
    cur: db.Cursor, subject: str, html: str, text: str | None, from_addr: str | None, variants: str | None = None
) -> int:
    """A draft; `variants`: the JSON of {tag: {subject, html, text}} (None: the default only)."""
    cur.execute(CREATE, (subject, html, text, from_addr, variants))
    return int(cur.fetchone()[0])


def queue(
    cur: db.Cursor, newsletter_id: int, audience: str, local_time: time | None, respect_quiet_hours: bool = False
) -> bool:
    """draft or scheduled -> queued (the outbox builder is kicked by the caller). False: not possible now."""
    cur.execute(QUEUE, (audience, local_time, respect_quiet_hours, newsletter_id))
    return cur.fetchone() is not None


def schedule(
    cur: db.Cursor,
    newsletter_id: int,
    audience: str,
    local_time: time | None,
    send_at: datetime,
    respect_quiet_hours: bool = False,
) -> bool:
    """draft or scheduled -> scheduled, changed whole. False: not possible now."""
    cur.execute(SCHEDULE, (audience, local_time, respect_quiet_hours, send_at, newsletter_id))
    return cur.fetchone() is not None


def start_scheduled(cur: db.Cursor) -> list[int]:
    """scheduled -> queued for every newsletter whose send_at has come; their ids."""
    cur.execute(START_SCHEDULED)
    return [row[0] for row in cur.fetchall()]


def start_sending(cur: db.Cursor, newsletter_id: int) -> None:
    cur.execute(START_SENDING, (newsletter_id,))


def outbox_complete(cur: db.Cursor, newsletter_id: int) -> None:
    cur.execute(OUTBOX_COMPLETE, (newsletter_id,))


def pause(cur: db.Cursor, newsletter_id: int) -> bool:
    cur.execute(PAUSE, (newsletter_id,))
    return cur.fetchone() is not None


def resume(cur: db.Cursor, newsletter_id: int) -> tuple[bool, bool]:
    """paused -> sending: (resumed, whether its outbox was complete)."""
    cur.execute(RESUME, (newsletter_id,))
    row = cur.fetchone()
    return (row is not None, row is not None and row[0] is not None)


def cancel(cur: db.Cursor, newsletter_id: int) -> bool:
    cur.execute(CANCEL, (newsletter_id,))
    return cur.fetchone() is not None


def retry_failed(cur: db.Cursor, newsletter_id: int) -> int:
    """failed rows -> pending (attempts start again), and a done newsletter sending again; how many."""
    cur.execute(RETRY_FAILED, (newsletter_id,))
    requeued = int(cur.rowcount)
    if requeued:
        cur.execute(REOPEN, (newsletter_id,))
    return requeued


def finish(cur: db.Cursor, newsletter_id: int | None) -> list[int]:
    """sending -> done for this newsletter (None: every one) once nothing is pending or sending."""
    cur.execute(DONE, {"nl": newsletter_id})
    return [row[0] for row in cur.fetchall()]


def may_send(cur: db.Cursor, newsletter_id: int) -> tuple[str, bool]:
    """(status, whether mail may go out at all): read by a send loop between two mails."""
    cur.execute(MAY_SEND, (newsletter_id,))
    status, allowed = cur.fetchone()
    return status, bool(allowed)


def fill_range(
    cur: db.Cursor, newsletter_id: int, lo: int, hi: int, due: dict[str, Any], choice: dict[str, Any] | None = None
) -> int:
    """Outbox rows for the subscribers with lo < id <= hi; `due`: schedule.due_times(); `choice`:
    variants.parameters() (None: the default for everyone). How many."""
    cur.execute(INSERT_RANGE, {**due, **(choice or NO_VARIANTS), "nl": newsletter_id, "lo": lo, "hi": hi})
    return int(cur.rowcount)


def fill_user_ids(
    cur: db.Cursor, newsletter_id: int, user_ids: list[str], due: dict[str, Any], choice: dict[str, Any] | None = None
) -> int:
    """Outbox rows for the subscribers with these user_ids; how many."""
    cur.execute(INSERT_USER_IDS, {**due, **(choice or NO_VARIANTS), "nl": newsletter_id, "user_ids": user_ids})
    return int(cur.rowcount)


def claim(cur: db.Cursor, newsletter_id: int, limit: int, after: int) -> list[Claimed]:
    cur.execute(CLAIM, {"nl": newsletter_id, "limit": limit, "after": after})
    return [Claimed(*row) for row in cur.fetchall()]


def mark(cur: db.Cursor, marks: list[Mark]) -> None:
    db.execute_values(cur, MARK, marks, template=MARK_TEMPLATE, page_size=1000)


def release(cur: db.Cursor, row_ids: list[int]) -> None:
    cur.execute(RELEASE, (row_ids,))


def defer(cur: db.Cursor, waits: list[tuple[int, datetime]]) -> None:
    """sending -> pending until a moment: [(row id, until)]."""
    if waits:
        cur.execute(DEFER, ([i for i, _ in waits], [u for _, u in waits]))


def reclaim(cur: db.Cursor, older_than_seconds: float) -> list[int]:
    """sending rows claimed longer ago than this -> pending; the newsletter of each."""
    cur.execute(RECLAIM, (older_than_seconds,))
    return [row[0] for row in cur.fetchall()]


def renew(cur: db.Cursor, row_ids: list[int]) -> int:
    """The claim on these rows, still `sending`, renewed by their live holder; how many."""
    cur.execute(RENEW, (row_ids,))
    return int(cur.rowcount)


def cancel_pending(cur: db.Cursor, newsletter_id: int, limit: int) -> int:
    """Up to `limit` pending rows -> cancelled; how many."""
    cur.execute(CANCEL_PENDING_CHUNK, (newsletter_id, limit))
    return int(cur.rowcount)


def sending_ids(cur: db.Cursor) -> list[int]:
    """The newsletters now `sending` (to restart their chains when the emergency stop is released)."""
    cur.execute("SELECT id FROM newsletters WHERE status = 'sending' ORDER BY id")
    return [row[0] for row in cur.fetchall()]


# -- right to erasure: this domain's steps (app/operations/erasure.py composes every domain's) -------
def addresses_mailed(cur: db.Cursor, subscriber_id: int) -> set[str]:
    """Every address this subscriber was sent newsletters at (it may have changed since), as stored."""
    cur.execute("SELECT DISTINCT email FROM email_log WHERE subscriber_id = %s", (subscriber_id,))
    return {row[0] for row in cur.fetchall()}


def erase_from_audiences(cur: db.Cursor, user_id: str) -> None:
    """A newsletter's audience lists user_ids (jsonb {"kind": "user_ids", "user_ids": [...]},
    app/newsletter/service.py): this one leaves every list. Run last in the erasure, so the newsletter
    rows it changes stay locked for the shortest time (a pause or cancel of one waits for it; the
    outbox's inserts do not: a non-key update)."""
    cur.execute(
        "UPDATE newsletters SET audience = jsonb_set(audience, '{user_ids}', (audience -> 'user_ids') - %s) "
        "WHERE audience -> 'user_ids' ? %s",
        (user_id, user_id),
    )
