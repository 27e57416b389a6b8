"""Newsletter rows that must wait when claimed (issue 40): the recipient's quiet hours, when the send
asked for `respect_quiet_hours`, and their mail budget of the day.

Checked at claim, in the claim's transaction, because that is when the mail would go: a row claimed
inside its recipient's window goes back to `pending` until the window ends; a row whose recipient's
day is spent goes back until their next local day begins (never dropped). Both keep the row's
not_before, as a local_time send's rows do (app/newsletter/rows.py DEFER), and the claim's attempt
is refunded. The budget is counted here for every row that goes (app/subscribers/budget.py: exact
under concurrency, two chains or two newsletters at once included). Nothing is asked of Postgres
for a batch whose recipients have no budget, and quiet hours cost nothing for a send that does not
respect them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from app.newsletter import rows as newsletter_rows
from app.newsletter.rows import Claimed
from app.platform import config, db, metrics
from app.subscribers import budget, quiet_hours

log = logging.getLogger("app.newsletter.waits")


def claim(
    cur: db.Cursor, newsletter_id: int, limit: int, after: int, respect_quiet_hours: bool
) -> tuple[list[Claimed], int]:
    """Claim a batch (rows.claim) and send back what must wait. Returns (rows to send or record as
    suppressed, the largest row id the claim took: the send loop's cursor; 0 when it took none)."""
    claimed = newsletter_rows.claim(cur, newsletter_id, limit, after)
    if not claimed:
        return claimed, 0
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
    refused = budget.spend(
        cur, [budget.Spend(row.subscriber_id, row.timezone, row.max_mails_per_day, must=False) for row in going], now
    )
    if refused:
        over = [row for row in going if row.subscriber_id in refused]
        waits += [(row.id, budget.next_day(now, row.timezone)) for row in over]
        metrics.MAIL_HELD.labels("budget").inc(len(over))
    if not waits:
        return claimed, last
    newsletter_rows.defer(cur, waits)
    log.info(
        "newsletter %s: %d recipient(s) wait for the end of their quiet hours or for their next day's budget",
        newsletter_id,
        len(waits),
    )
    waiting = {row_id for row_id, _ in waits}
    return [row for row in claimed if row.id not in waiting], last
