"""Claim due digest runs for one batch and apply the claim-time checks (I6: an unsubscribe,
suppression or pause made a second ago counts; so do quiet hours, app/subscribers/quiet_hours.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from app.platform import config, metrics, timezones
from app.platform.providers.base import OutgoingMail
from app.subscribers import quiet_hours
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
    digest: digest_group.Digest | None = None
    mail: OutgoingMail | None = None
    cover: Cover | None = None  # what recording it handles (digest/marks.py); None: its events one by one

    def skip_reason(self) -> str | None:
        if self.refusal is not None:
            reason = self.refusal.split(":")[0]  # the suppression's own reason is not the run's
            return "cadence changed" if reason == "cadence off" else reason
        if self.cadence != "immediately" and self.subscriber_cadence != self.cadence:
            # "send now" mail goes at any cadence but off; a digest only at its own
            return "cadence changed"
        return None

    @property
    def urgent_only(self) -> bool:
        """A "send now" run of a digest subscriber carries only the events that cannot wait."""
        return self.cadence == "immediately" and self.subscriber_cadence != "immediately"


def claim(
    cur, run_ids: list[int] | None, limit: int, max_attempts: int
) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Claim runs (given ids, or any due ones) in the caller's transaction. Returns (runs to build,
    [(run_id, skip_reason)]); skipped runs are already written. A second run of a subscriber who
    already has one processing goes back to pending at once (attempt counted, no backoff); a run due
    inside its subscriber's quiet hours goes back to pending until they end (no attempt counted)."""
    claimed = sorted((ClaimedRun(*row) for row in digest_runs.claim(cur, run_ids, limit)), key=lambda r: r.id)
    if not claimed:
        return [], []
    digest_runs.lock_subscribers(cur, [r.subscriber_id for r in claimed])
    busy = digest_runs.subscribers_busy_elsewhere(cur, [r.subscriber_id for r in claimed], [r.id for r in claimed])
    ready, skipped, release, held, seen = [], [], [], [], set(busy)
    now, default_window = datetime.now(UTC), quiet_hours.parse_setting(config.get().default_quiet_hours)
    for run in claimed:
        reason = run.skip_reason()
        if run.subscriber_id in seen:
            release.append((run.id, "another digest of this subscriber was processing"))
        elif reason:
            skipped.append((run.id, reason))
        elif until := _quiet_until(run, now, default_window):
            held.append((run.id, until))
        else:
            ready.append(run)
        seen.add(run.subscriber_id)
    digest_runs.mark_skipped(cur, skipped)
    digest_runs.retry(cur, release, max_attempts, base_seconds=0)
    digest_runs.hold(cur, held)
    if held:
        metrics.MAIL_HELD.labels("quiet_hours").inc(len(held))
        log.info("%d digest run(s) due in their subscriber's quiet hours wait for the window's end", len(held))
    return ready, skipped


def _quiet_until(run: ClaimedRun, now: datetime, default_window) -> datetime | None:
    """When the subscriber's quiet hours holding `now` end; None when the run may go now."""
    window = quiet_hours.parse_setting(run.quiet_hours) if run.quiet_hours else default_window
    if window is None:
        return None
    return quiet_hours.held_until(now, timezones.load(run.timezone), window)
