"""Claim due digest runs for one batch and apply the claim-time checks (I6: an unsubscribe,
suppression or pause made a second ago counts; so do quiet hours, app/subscribers/quiet_hours.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime

from app.platform import config, metrics
from app.platform.providers.base import OutgoingMail
from app.subscribers import budget, quiet_hours
from digest import group as digest_group
from digest import runs as digest_runs
from digest.marks import Cover

log = logging.getLogger("digest.claim")


@dataclass
class ClaimedRun:
    id: int
    cadence: str
    attempts: int
    subscriber_id: int
    user_id: str
    email: str
    name: str
    subscriber_cadence: str
    token_version: int
    tracking_opt_out: bool
    refusal: str | None  # app/subscribers/mailable.py: why this subscriber may not be mailed now
    timezone: str = "UTC"
    last_digest_at: datetime | None = None  # the previous digest's send time (None: first)
    locale: str | None = None  # the subscriber's language (None: DEFAULT_LOCALE)
    provider: str | None = None  # set: an ambiguous attempt there; only that provider may send it
    quiet_hours: str | None = None  # the subscriber's window ("22:00-07:00"; None: DEFAULT_QUIET_HOURS)
    held: bool = False  # it waited for the end of those quiet hours: "while you were away"
    max_mails_per_day: int | None = None  # the subscriber's budget (None: DEFAULT_MAX_MAILS_PER_DAY; 0: none)
    counted_on: date | None = None  # the local day the claim counted this mail on (app/subscribers/budget.py)
    digest: digest_group.Digest | None = None
    mail: OutgoingMail | None = None
    cover: Cover | None = None  # what recording it handles (digest/marks.py); None: its events one by one

    def skip_reason(self) -> str | None:
        if self.refusal is not None:
            reason = self.refusal.split(":")[0]  # the suppression's own reason is not the run's
            return "cadence changed" if reason == "cadence off" else reason
        if self.cadence not in ("immediately", "critical") and self.subscriber_cadence != self.cadence:
            # "send now" and critical mail go at any cadence but off; a digest only at its own
            return "cadence changed"
        return None

    @property
    def urgent_only(self) -> bool:
        """A "send now" run of a digest subscriber carries only the events that cannot wait."""
        return self.cadence == "immediately" and self.subscriber_cadence != "immediately"

    @property
    def critical(self) -> bool:
        """A run of critical events: only those, at once, whatever quiet hours or the budget."""
        return self.cadence == "critical"

    @property
    def may_wait(self) -> bool:
        """Send-now mail can wait for the budget; digests and critical mail go (and count)."""
        return self.cadence == "immediately"


def claim(
    cur, run_ids: list[int] | None, limit: int, max_attempts: int, now: datetime | None = None
) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Claim runs (given ids, or any due ones) in the caller's transaction. Returns (runs to build,
    [(run_id, skip_reason)]); skipped runs are already written. A second run of a subscriber who
    already has one processing goes back to pending at once (attempt counted, no backoff); a run due
    inside its subscriber's quiet hours goes back to pending until they end (no attempt counted)."""
    # A subscriber's critical run first: claimed beside another of theirs, it goes and the other waits.
    claimed = sorted(
        (ClaimedRun(*row) for row in digest_runs.claim(cur, run_ids, limit)), key=lambda r: (not r.critical, r.id)
    )
    if not claimed:
        return [], []
    digest_runs.lock_subscribers(cur, [r.subscriber_id for r in claimed])
    busy = digest_runs.subscribers_busy_elsewhere(cur, [r.subscriber_id for r in claimed], [r.id for r in claimed])
    ready, skipped, release, held, seen = [], [], [], [], set(busy)
    settings = config.get()
    # `now`: the moment the checks are made for (tests give a controlled clock); the claim's own SQL
    # takes what is due by the database's clock.
    now, default_window = now or datetime.now(UTC), quiet_hours.parse_setting(settings.default_quiet_hours)
    for run in claimed:
        reason = run.skip_reason()
        if run.subscriber_id in seen:
            release.append((run.id, "another digest of this subscriber was processing"))
        elif reason:
            skipped.append((run.id, reason))
        elif not run.critical and (
            until := quiet_hours.subscriber_held_until(now, run.timezone, run.quiet_hours, default_window)
        ):
            held.append((run.id, until))
        else:
            ready.append(run)
        seen.add(run.subscriber_id)
    ready, over_budget = _spend_budget(cur, ready, now)
    folded = [(r.id, FOLDED) for r in over_budget if r.subscriber_cadence != "immediately"]
    next_day = [(r.id, budget.next_day(now, r.timezone)) for r in over_budget if r.subscriber_cadence == "immediately"]
    digest_runs.mark_skipped(cur, skipped + folded)
    digest_runs.retry(cur, release, max_attempts, base_seconds=0)
    digest_runs.hold(cur, held)
    digest_runs.hold(cur, next_day, away=False)
    if held:
        metrics.MAIL_HELD.labels("quiet_hours").inc(len(held))
        log.info("%d digest run(s) due in their subscriber's quiet hours wait for the window's end", len(held))
    if over_budget:
        metrics.MAIL_HELD.labels("budget").inc(len(over_budget))
        log.info(
            "%d send-now run(s) over their subscriber's mail budget: %d fold into the next digest, %d wait for "
            "the next local day",
            len(over_budget),
            len(folded),
            len(next_day),
        )
    return ready, skipped + folded


# A send-now run over its subscriber's budget, of a digest subscriber: skipped without touching its
# events, so the next digest carries them.
FOLDED = "mail budget spent: folded into the next digest"


def _spend_budget(cur, ready: list[ClaimedRun], now: datetime):
    """Count each mail against its subscriber's day (app/subscribers/budget.py). Returns (runs that
    go, send-now runs over budget)."""
    wanted = [
        budget.Spend(r.subscriber_id, r.timezone, r.max_mails_per_day, must=not r.may_wait)
        for r in budget.limited(ready, config.get().default_max_mails_per_day)
    ]
    spent = budget.spend(cur, wanted, now)
    for run in ready:
        run.counted_on = spent.counted.get(run.subscriber_id)
    refused = spent.refused
    if not refused:
        return ready, []
    return [r for r in ready if r.subscriber_id not in refused], [r for r in ready if r.subscriber_id in refused]
