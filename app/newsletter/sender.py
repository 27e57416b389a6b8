"""The send loop behind the `send_batch` actor: claim → render → provider → mark, repeated for a
few seconds, then the chain re-enqueues itself (so digests on other queues get threads in between
and a pause is noticed at the next claim).

Exactly-once per recipient rests on: the unique outbox row; the claim (`pending → sending` under
FOR UPDATE SKIP LOCKED, so two workers never hold the same row; the transitions are rows.py's);
marking only rows still `sending`;
and the per-row idempotency key for the one window no database can close (the provider accepted a
batch and the worker died before committing `sent`: the reclaimer re-sends that batch with the
same keys).

Controls (pause, cancel, the emergency stop) hold within a second: the provider reports every
result as it arrives and starts no mail once asked to stop (app/platform/providers/base.py `Progress`). At
least every FLUSH_EVERY mails or SEND_CHECK_SECONDS, the chain writes the outcomes so far and
reads the newsletter's status and the emergency stop; when it may not go on, the rows claimed but
not started go back to `pending` (or `cancelled`) with their attempt refunded. The same rhythm
bounds a crash: a worker killed mid-batch leaves at most that many accepted mails unrecorded (the
reclaimer re-sends them with the same keys).

A database that blinks never makes a live worker send twice: when a flush cannot be written the
batch starts no further mail, the outcomes stay in the process and are written once Postgres
answers again, and the claim on the rows is renewed meanwhile (app/platform/holds.py), so the
reclaimer leaves them alone. Only a dead worker's rows are sent again.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from app.newsletter import growth, kick, ratelimit, template, tracked, variants, waits
from app.newsletter import rows as newsletter_rows
from app.newsletter.ratelimit import AdaptiveRateLimiter
from app.newsletter.rows import Claimed, Mark
from app.newsletter.template import Compiled
from app.platform import config, db, holds, host, mail, metrics, shutdown, tokens
from app.platform.config import Settings
from app.platform.mail_stop import SEND_CHECK_SECONDS
from app.platform.providers import get_provider
from app.platform.providers.base import (
    OutgoingMail,
    PermanentError,
    Progress,
    Provider,
    SendResult,
    ThrottledError,
    TransientError,
)
from app.subscribers import streams
from tracking.links import LinkRewriter

log = logging.getLogger("app.newsletter.sender")

BUDGET_SECONDS = 5.0  # one message's share of a worker thread before it re-enqueues
BACKOFF_BASE_SECONDS = 5.0  # transient failure n waits base * 2^(n-1) (capped), with jitter
BACKOFF_MAX_SECONDS = 1800.0
MAX_RATE_WAIT = 2.0  # sleep at most this long for the rate limiter; longer = re-enqueue later
IDLE_RECHECK_MAX = 60.0  # rows in backoff due within this: the chain waits; later: the tick re-kicks
HANDOFF_SECONDS = 1.0  # a chain met in a stopping worker continues after this (for the next worker)
FLUSH_EVERY = 100  # outcomes written (and controls read) at least every this many mails


def _load(newsletter_id: int):
    rows = db.thread_connection.run(
        "SELECT status, subject, html, text, from_addr, outbox_completed_at, "
        "EXISTS (SELECT 1 FROM mail_stop), variants, respect_quiet_hours FROM newsletters WHERE id = %s",
        (newsletter_id,),
    )
    return rows[0] if rows else None


@dataclass
class SendStats:
    """What one send_batch call did (for logs and tests)."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0
    retry: int = 0
    suppressed: int = 0
    released: int = 0
    outcome: str = ""
    retry_in: float | None = None  # seconds after which the chain continues; None: it does not
    provider_seconds: float = 0.0  # in successful provider calls (app/newsletter/growth.py)
    grew: bool = False  # this call added send chains


@dataclass
class Renderer:
    """One newsletter's mail to each recipient: each variant's template compiled once (the default's
    at once, a variant's when a recipient of it first comes), links tracked per mail."""

    newsletter_id: int
    compiled: Compiled
    rewriter: LinkRewriter
    from_addr: str | None
    tracking: bool  # TRACKING (a recipient may still have opted out)
    variants: dict | None = None  # {tag: {"subject", "html", "text"}} as stored
    by_variant: dict[str, Compiled] = field(default_factory=dict)  # compiled so far, for this call
    # each compiled template's tracked links planned once (None: rewritten per mail); app/newsletter/tracked.py
    plans: dict[int, tracked.Plan | None] = field(default_factory=dict)
    tracker: tracked.Tracker | None = None

    @classmethod
    def load(
        cls,
        newsletter_id: int,
        subject: str,
        html: str,
        text: str | None,
        from_addr: str | None,
        stored_variants: dict | None = None,
    ) -> Renderer:
        compiled = template.compiled_for(newsletter_id, subject, html, text)
        rewriter = LinkRewriter("newsletter", newsletter_id)
        return cls(newsletter_id, compiled, rewriter, from_addr, config.get().tracking, stored_variants)

    def compiled_variant(self, variant: str | None) -> Compiled:
        """The compiled template of a variant (None, or one the newsletter no longer has: the default)."""
        content = (self.variants or {}).get(variant) if variant is not None else None
        if content is None or variant is None:
            return self.compiled
        found = self.by_variant.get(variant)
        if found is None:
            found = template.compiled_for(
                self.newsletter_id, content["subject"], content["html"], content.get("text"), variant
            )
            self.by_variant[variant] = found
        return found

    def _plan(self, compiled: Compiled) -> tracked.Plan | None:
        key = id(compiled)
        if key not in self.plans:
            self.plans[key] = tracked.plan(compiled.html_tokens, self.rewriter, compiled.html_ascii)
            if self.tracker is None:
                self.tracker = tracked.Tracker(self.rewriter, "newsletter", self.newsletter_id)
        return self.plans[key]

    def render(self, row: Claimed) -> OutgoingMail:
        # The newsletter stream's link: a one-click unsubscribe stops newsletters, not digests.
        sub_id, token_version = row.subscriber_id, row.token_version
        unsubscribe_url = tokens.unsubscribe_url(sub_id, token_version, streams.NEWSLETTER_MAIL_SCOPE)
        variant = row.variant if row.variant in (self.variants or {}) else None
        compiled = self.compiled_variant(variant)
        context = {
            "name": row.name or "",
            "email": row.email,
            "user_id": row.user_id,
            "unsubscribe_url": unsubscribe_url,
            "preferences_url": tokens.preferences_url(sub_id, token_version),
            "locale": variants.render_locale(variant, row.locale),
        }
        track = self.tracking and not row.tracking_opt_out
        plan = self._plan(compiled) if track else None
        if plan is not None and plan.dynamic:
            context = compiled.full_context(context)
            if not plan.applies(context, self.rewriter):
                plan = None
        if plan is not None:
            assert self.tracker is not None
            rendered = compiled.render(context, plan.template, self.tracker.values(plan, sub_id))
            html = rendered.html
        else:
            rendered = compiled.render(context, compiled.mail_html)
            html = self.rewriter.rewrite(rendered.html, sub_id, enabled=track)
        return OutgoingMail(
            to=row.email,
            to_name=row.name or "",
            subject=rendered.subject,
            html=html,
            text=rendered.text,
            idempotency_key=f"newsletter-{self.newsletter_id}-row-{row.id}",
            from_addr=self.from_addr,
            provider=row.provider,
            headers=mail.unsubscribe_headers(unsubscribe_url),
            template=f"newsletter-{self.newsletter_id}-{variant or 'default'}",
            custom_args={
                "mail_kind": "newsletter",
                "mail_id": str(self.newsletter_id),
                "row_id": str(row.id),
                "subscriber_id": str(sub_id),
            },
        )


@dataclass
class _Chain:
    """What every batch of one send_batch call shares (the newsletter is the renderer's)."""

    renderer: Renderer
    provider: Provider
    limiter: AdaptiveRateLimiter
    settings: Settings
    stats: SendStats


def send_batch(
    newsletter_id: int, provider=None, budget_seconds: float = BUDGET_SECONDS, reenqueue: bool = True
) -> SendStats:
    """Send batches for up to `budget_seconds`; returns what happened (for logs and tests).
    With reenqueue=False (tests, benchmark baseline) the chain is not continued."""
    settings = config.get()
    stats = SendStats()
    row = _load(newsletter_id)
    if row is None or row[0] != "sending":
        stats.outcome = f"not sending ({row[0] if row else 'missing'})"
        return stats
    if row[6]:
        stats.outcome = "all mail is stopped; releasing the stop restarts this newsletter"
        return stats
    _, subject, html, text, from_addr, _, _, stored_variants, respect_quiet_hours = row
    if provider is None:
        provider = get_provider()
    limiter = ratelimit.for_provider(provider.name)
    preferred = getattr(provider, "preferred_batch", provider.max_batch)
    batch_size = max(1, min(settings.send_batch_size or preferred, provider.max_batch))
    if limiter.ceiling > 0:  # at most one second's worth per call, so a low limit paces smoothly
        batch_size = max(1, min(batch_size, int(limiter.ceiling)))
    renderer = Renderer.load(newsletter_id, subject, html, text, from_addr, stored_variants)
    chain = _Chain(renderer, provider, limiter, settings, stats)
    started = time.monotonic()
    deadline = started + budget_seconds
    after = 0  # claim cursor (rows.claim)

    while True:
        # Checked before every claim, the first too: a message taken while the worker shuts down
        # (Dramatiq still hands out the chain's own continuation) claims nothing and passes the
        # chain on, a moment later so that this worker's other threads do not take it back at once.
        if shutdown.requested.is_set():
            stats.outcome, stats.retry_in = "worker stopping; continuing", HANDOFF_SECONDS
            if reenqueue:
                kick.continue_chain(newsletter_id, delay_ms=int(HANDOFF_SECONDS * 1000))
            return stats
        kick.mark_alive(newsletter_id)
        granted, wait = limiter.acquire(batch_size, max_wait=MAX_RATE_WAIT)
        if not granted:
            stats.outcome, stats.retry_in = f"rate limited for {wait:.1f}s", wait
            if reenqueue:
                kick.mark_alive(newsletter_id, ttl=kick.ALIVE_TTL_SECONDS + wait)
                kick.continue_chain(newsletter_id, delay_ms=int(wait * 1000))
            return stats
        batch = db.thread_connection.call(waits.claim, newsletter_id, batch_size, after, respect_quiet_hours)
        if not batch.last and after:
            after = 0
            batch = db.thread_connection.call(waits.claim, newsletter_id, batch_size, after, respect_quiet_hours)
        if not batch.last:
            break
        after = batch.last  # rows that must wait (quiet hours, the budget) are behind the cursor too
        stats.claimed += len(batch.rows)
        retry_after = _send_claimed(chain, batch.rows, batch.counted) if batch.rows else None
        if retry_after is not None:  # throttled: everyone waits; this chain comes back after the reset
            stats.outcome, stats.retry_in = f"throttled for {retry_after:.1f}s", retry_after
            if reenqueue:
                kick.mark_alive(newsletter_id, ttl=kick.ALIVE_TTL_SECONDS + retry_after)
                kick.continue_chain(newsletter_id, delay_ms=int(retry_after * 1000))
            return stats
        if (
            reenqueue
            and not stats.grew
            and growth.wants_more(stats.provider_seconds, time.monotonic() - started, host.host_idle.share())
        ):
            stats.grew = growth.grow(
                newsletter_id, settings.newsletter_send_chains, settings.newsletter_send_chains_max
            )
        if time.monotonic() >= deadline:  # after a batch: a budget of 0 sends one
            stats.outcome, stats.retry_in = "budget used; continuing", 0.0
            if reenqueue:
                kick.continue_chain(newsletter_id)
            return stats
    stats.outcome, stats.retry_in = _when_idle(newsletter_id, reenqueue)
    return stats


def _send_claimed(chain: _Chain, claimed: list[Claimed], counted: dict | None = None) -> float | None:
    """Render, send and record one claimed batch, recording as it goes and stopping between two
    mails when the newsletter may not go on. Returns seconds to back off if throttled. The claim is
    held (renewed) until every outcome is written."""
    sending = [row.id for row in claimed if row.status == "sending"]
    with holds.hold("newsletter rows", sending, newsletter_rows.renew, chain.settings.reclaim_after_seconds):
        return _send_held(chain, claimed, counted or {})


def _send_held(chain: _Chain, claimed: list[Claimed], counted: dict) -> float | None:
    newsletter_id, stats = chain.renderer.newsletter_id, chain.stats
    outcomes = _Outcomes(newsletter_id, chain.settings, stats, counted)
    mails, mail_rows = [], []
    for row in claimed:
        if row.status == "suppressed":
            stats.suppressed += 1
            metrics.NEWSLETTER_RECIPIENTS.labels("suppressed").inc()
            continue
        try:
            mails.append(chain.renderer.render(row))
            mail_rows.append((row.id, row.attempts))
        except Exception as exc:  # one recipient's render problem must not hold up the batch
            log.exception("newsletter %s row %s: render failed", newsletter_id, row.id)
            outcomes.marks.append(Mark(row.id, "failed", None, f"render failed: {exc}"[:1000], None, 0))
            stats.failed += 1
    retry_after = None
    if mails:
        outcomes.rows = mail_rows
        progress = Progress(outcomes.flush, every=FLUSH_EVERY, interval=SEND_CHECK_SECONDS)
        called = time.monotonic()
        try:
            results = chain.provider.send_batch(mails, progress)
            if len(results) != len(mails):  # never leave a row `sending` because a provider miscounted
                raise TransientError(f"provider returned {len(results)} results for {len(mails)} mails")
            chain.limiter.succeeded()
            stats.provider_seconds += time.monotonic() - called  # successful calls only: a failing
            # provider is not a reason to add chains (app/newsletter/growth.py)
        except ThrottledError as exc:
            outcomes.take(progress.drain())
            retry_after = exc.retry_after if exc.retry_after is not None else 1.0
            chain.limiter.throttled(retry_after)
            until = _now() + timedelta(seconds=retry_after)
            # A throttle is not the row's fault: refund the attempt.
            unrecorded = outcomes.unrecorded()
            outcomes.marks.extend(Mark(mail_rows[i][0], "pending", None, str(exc)[:1000], until, 1) for i in unrecorded)
            stats.retry += len(unrecorded)
            log.warning(
                "newsletter %s: %d row(s) throttled, retry in %.1fs", newsletter_id, len(unrecorded), retry_after
            )
        except TransientError as exc:
            outcomes.take(progress.drain())  # accepted before the error: recorded as such
            results = [SendResult(ok=False, error=str(exc)) for _ in mails]
            log.warning("newsletter %s: transient provider error for %d row(s): %s", newsletter_id, len(mails), exc)
        except PermanentError as exc:
            outcomes.take(progress.drain())  # accepted before the error: recorded as such
            results = [SendResult(ok=False, error=str(exc), permanent=True) for _ in mails]
            log.error("newsletter %s: provider rejected a batch of %d: %s", newsletter_id, len(mails), exc)
        except Exception as exc:  # a bug or an unexpected library error: retry the rows later, loudly
            outcomes.take(progress.drain())  # accepted before the error: recorded as such
            results = [SendResult(ok=False, error=f"unexpected: {exc!r}") for _ in mails]
            log.exception("newsletter %s: unexpected error sending a batch", newsletter_id)
        if retry_after is None:
            outcomes.take(list(enumerate(results)))
    outcomes.write()
    return retry_after


class _Outcomes:
    """One claimed batch's outcomes, written as they come (Progress calls flush() on the chain's
    thread). Each row is recorded once: what a flush wrote is skipped at the end."""

    def __init__(self, newsletter_id: int, settings: Settings, stats: SendStats, counted: dict | None = None):
        self.newsletter_id, self.settings, self.stats = newsletter_id, settings, stats
        self.counted = counted or {}  # row id: (subscriber, day) the budget counted (app/newsletter/waits.py)
        self.rows: list[tuple[int, int]] = []  # (row id, attempts) by position in the batch
        self.recorded: set[int] = set()  # positions taken
        self.marks: list[Mark] = []  # not written yet
        self.released: list[int] = []  # row ids not started, not written yet

    def take(self, results: list[tuple[int, SendResult]]) -> None:
        for position, result in results:
            if position in self.recorded:
                continue
            self.recorded.add(position)
            row_id, attempts = self.rows[position]
            if result.stopped:
                self.released.append(row_id)
            else:
                self.marks.extend(_marks_for([result], [(row_id, attempts)], self.settings, self.stats))

    def unrecorded(self) -> list[int]:
        return [i for i in range(len(self.rows)) if i not in self.recorded]

    def flush(self, results: list[tuple[int, SendResult]]) -> bool:
        """Record what arrived; True when the newsletter may not go on (the provider stops). Written
        once, not retried: when it cannot be, this raises and the provider starts no further mail."""
        self.take(results)
        self.write(until_written=False)
        status, may_send = db.thread_connection.call(newsletter_rows.may_send, self.newsletter_id)
        return status != "sending" or not may_send

    def write(self, until_written: bool = True) -> None:
        """What the provider accepted is written — at the end of the batch, once Postgres answers
        again, however long that takes: the rows stay `sending` and this process renews its claim
        meanwhile (app/platform/holds.py), so nobody else sends them."""
        if self.marks:
            marks = self.marks
            self._write(waits.mark, marks, f"recording {len(marks)} outcomes", until_written)
            self.marks = []
            metrics.newsletter_marks(marks)  # committed: sent / retry / failed
        if self.released:
            released = self.released
            self._write(waits.release, released, f"releasing {len(released)} rows not sent", until_written)
            self.released = []
            self.stats.released += len(released)
            log.info(
                "newsletter %s: stopped between two mails; %d claimed row(s) not sent were released",
                self.newsletter_id,
                len(released),
            )

    def _write(self, statement, items: list, what: str, until_written: bool) -> None:
        def work():
            return db.thread_connection.call(statement, items, self.counted)

        if until_written:
            db.until_written(work, None, f"newsletter {self.newsletter_id}: {what}")
        else:
            work()


def _marks_for(results, mail_rows, settings: Settings, stats: SendStats):
    for result, (row_id, attempts) in zip(results, mail_rows):
        if result.ok:
            stats.sent += 1
            yield Mark(row_id, "sent", result.message_id, None, None, 0, result.provider)
        elif result.permanent or attempts >= settings.newsletter_max_attempts:
            stats.failed += 1
            yield Mark(row_id, "failed", None, (result.error or "rejected")[:1000], None, 0)
        else:
            stats.retry += 1
            # maybe accepted (ambiguous): the retry goes to that provider alone
            pin = result.provider if result.ambiguous else None
            yield Mark(
                row_id, "pending", None, (result.error or "transient")[:1000], _now() + backoff(attempts), 0, pin
            )


def backoff(attempts: int) -> timedelta:
    seconds = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** max(0, attempts - 1))
    return timedelta(seconds=seconds * random.uniform(0.8, 1.2))


def _when_idle(newsletter_id: int, reenqueue: bool) -> tuple[str, float | None]:
    """Nothing claimable right now: finish, wait for the outbox, wait for backoff, or stop."""
    row = _load(newsletter_id)
    if row is None or row[0] != "sending":
        return f"stopped ({row[0] if row else 'missing'})", None
    if row[6]:
        return "all mail is stopped; releasing the stop restarts this newsletter", None
    if row[5] is None:
        if reenqueue:
            kick.continue_chain(newsletter_id, delay_ms=1000)
        return "waiting for the outbox", 1.0
    # Rows wait for a retry's backoff or for their recipient's local time (not_before).
    pending, next_due = db.thread_connection.run(
        "SELECT count(*), min(greatest(coalesce(next_attempt_at, now()), coalesce(not_before, now()))) - now() "
        "FROM email_log WHERE newsletter_id = %s AND status = 'pending'",
        (newsletter_id,),
    )[0]
    if pending:
        delay = max(0.2, next_due.total_seconds()) if next_due is not None else 0.2
        if delay <= IDLE_RECHECK_MAX:
            if reenqueue:
                kick.mark_alive(newsletter_id, ttl=kick.ALIVE_TTL_SECONDS + delay)
                kick.continue_chain(newsletter_id, delay_ms=int(delay * 1000))
            return f"{pending} row(s) waiting; next due in {delay:.1f}s", delay
        kick.clear_alive(newsletter_id)
        return f"{pending} row(s) not due for {IDLE_RECHECK_MAX:.0f}s or more; the scheduler tick re-kicks", None
    if db.thread_connection.call(newsletter_rows.finish, newsletter_id):
        log.info("newsletter %s done", newsletter_id)
        return "done", None
    return "other workers still hold rows", None


def _now() -> datetime:
    return datetime.now(UTC)
