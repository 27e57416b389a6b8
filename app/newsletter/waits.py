"""Newsletter rows that must wait when claimed (issue 40): the recipient's quiet hours, when the send
asked for `respect_quiet_hours`, and their mail budget of the day.

Checked at claim, in the claim's transaction, because that is when the mail would go: a row claimed
inside its recipient's window goes back to `pending` until the window ends; a row whose recipient's
day is spent goes back until their next local day begins (never dropped). Both keep the row's
not_before, as a local_time send's rows do (app/newsletter/rows.py DEFER), and the claim's attempt
is refunded. The budget is counted here for every row that goes (app/subscribers/budget.py: exact
under concurrency, two chains or two newsletters at once included), and given back with the
outcome of a row that did not go (`mark`, `release`). Nothing is asked of Postgres
for a batch whose recipients have no budget, and quiet hours cost nothing for a send that does not
respect them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from app.newsletter import rows as newsletter_rows
from app.newsletter.rows import Claimed, Mark
from app.platform import config, db, metrics
from app.subscribers import budget, quiet_hours

log = logging.getLogger("app.newsletter.waits")


@dataclass
class Batch:
    """What one claim hands the send loop."""

    rows: list[Claimed]  # to send, or to record as suppressed
    last: int  # the largest row id the claim took (the loop's cursor); 0: it took none
    counted: dict[int, tuple[int, date]] = field(default_factory=dict)  # row id: (subscriber, day) budgeted


def claim(cur: db.Cursor, newsletter_id: int, limit: int, after: int, respect_quiet_hours: bool) -> Batch:
    """Claim a batch (rows.claim) and send back what must wait."""
    claimed = newsletter_rows.claim(cur, newsletter_id, limit, after)
    if not claimed:
        return Batch(claimed, 0)
    last = max(row.id for row in claimed)
    settings = config.get()
    now = datetime.now(UTC)
    waits: list[tuple[int, datetime]] = []
    going = [row for row in claimed if row.status == "sending"]
    if respect_quiet_hours:
        default_window = quiet_hours.parse_setting(settings.default_quiet_hours)
        quiet = [
            (row, until)
            for row in going
            if (until := quiet_hours.subscriber_held_until(now, row.timezone, row.quiet_hours, default_window))
        ]
        if quiet:
            waits += [(row.id, until) for row, until in quiet]
            held = {row.id for row, _ in quiet}
            going = [row for row in going if row.id not in held]
            metrics.MAIL_HELD.labels("quiet_hours").inc(len(quiet))
    wanted = [
        budget.Spend(row.subscriber_id, row.timezone, row.max_mails_per_day, must=False)
        for row in budget.limited(going, settings.default_max_mails_per_day)
    ]
    spent = budget.spend(cur, wanted, now)
    counted = {row.id: (row.subscriber_id, day) for row in going if (day := spent.counted.get(row.subscriber_id))}
    if spent.refused:
        over = [row for row in going if row.subscriber_id in spent.refused]
        waits += [(row.id, budget.next_day(now, row.timezone)) for row in over]
        metrics.MAIL_HELD.labels("budget").inc(len(over))
    if not waits:
        return Batch(claimed, last, counted)
    newsletter_rows.defer(cur, waits)
    log.info(
        "newsletter %s: %d recipient(s) wait for the end of their quiet hours or for their next day's budget",
        newsletter_id,
        len(waits),
    )
    waiting = {row_id for row_id, _ in waits}
    return Batch([row for row in claimed if row.id not in waiting], last, counted)


def mark(cur: db.Cursor, marks: list[Mark], counted: dict[int, tuple[int, date]]) -> None:
    """The batch's outcomes (rows.mark), and a budgeted mail that did not go given back, in one
    transaction: a row retried later is counted once."""
    newsletter_rows.mark(cur, marks)
    budget.refund(cur, [counted[m.id] for m in marks if m.status != "sent" and m.id in counted])


def release(cur: db.Cursor, row_ids: list[int], counted: dict[int, tuple[int, date]]) -> None:
    """Rows not started (rows.release), their budgeted mails given back."""
    newsletter_rows.release(cur, row_ids)
    budget.refund(cur, [counted[row_id] for row_id in row_ids if row_id in counted])
