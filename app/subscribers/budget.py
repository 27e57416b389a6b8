"""The mail budget: at most N mails in a subscriber's local day (issue 40), the one owner of `mail_budget`.

A subscriber's limit is their `max_mails_per_day`, else DEFAULT_MAX_MAILS_PER_DAY; 0 is no limit
(nothing is counted). Every mail that goes to them counts — digests, send-now mail, critical mail,
newsletters — over their local day (their zone's midnight to midnight). What may be refused is only
what can wait: send-now mail (it folds into the next digest) and newsletters (held to the next local
day); digests and critical mail always go and still count.

`spend` is the one way to count, one statement per batch. It is exact under concurrency: each count
is decided on the row as the last committed spender left it, so two workers spending for one
subscriber never both take the last mail (INSERT … ON CONFLICT DO UPDATE waits for a conflicting
transaction and applies its condition to the row that one committed). A mail is counted when it is claimed to be
sent and given back (`refund`) when its outcome is recorded as anything but sent (nothing to send
after all, a retry, a failure), in that same transaction: a retried mail counts once. Only a worker
killed between the two leaves a mail counted that may not have gone, so a day's mails never exceed
the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import TypeVar

from app.platform import config, db, timezones
from app.platform.db import pg_array
from app.subscribers import quiet_hours

T = TypeVar("T")

# The limit in force for subscriber row `s` (0: none).
LIMIT = "coalesce({s}.max_mails_per_day, %(default_limit)s::int)"

# One statement: each counted subscriber's row is inserted (their first mail ever: 1 spent today) or
# updated, in subscriber order (two batches that share subscribers never deadlock). The decision is
# the DO UPDATE's condition, which Postgres applies to the row as the last committed spender left
# it (a conflicting insert waits for the other transaction, then updates): a mail that could wait
# (`cap`, the subscriber's limit) is counted only while the day's count is below it; a mail that
# must go (cap NULL: a digest, critical mail) always is. What the statement does not return was
# refused.
_SPEND = """
INSERT INTO mail_budget AS b (subscriber_id, day, spent, cap)
SELECT v.id, v.day, 1, v.cap
FROM unnest(%(ids)s::bigint[], %(days)s::date[], %(caps)s::int[]) AS v(id, day, cap)
ORDER BY v.id
ON CONFLICT (subscriber_id) DO UPDATE SET
    spent = CASE WHEN b.day = EXCLUDED.day THEN b.spent + 1 ELSE 1 END,
    day = EXCLUDED.day,
    cap = coalesce(EXCLUDED.cap, b.cap)
WHERE b.day <> EXCLUDED.day OR EXCLUDED.cap IS NULL OR b.spent < EXCLUDED.cap
RETURNING b.subscriber_id
"""

# A counted mail that did not go (nothing to send after all, a retry, a failure): given back on the
# day it was counted, in the transaction that records its outcome, so a retried mail counts once.
_REFUND = """
UPDATE mail_budget b SET spent = b.spent - 1
FROM unnest(%s::bigint[], %s::date[]) AS v(id, day)
WHERE b.subscriber_id = v.id AND b.day = v.day AND b.spent > 0
"""

_SPENT_TODAY = f"""
SELECT CASE WHEN b.day = (%(now)s::timestamptz AT TIME ZONE s.timezone)::date THEN b.spent ELSE 0 END,
       {LIMIT.format(s="s")}
FROM subscribers s LEFT JOIN mail_budget b ON b.subscriber_id = s.id
WHERE s.id = %(id)s
"""


@dataclass(frozen=True)
class Spend:
    """One mail to count, with what the caller's claim read of its subscriber."""

    subscriber_id: int
    timezone: str  # their zone: the local day the mail counts in
    limit: int | None  # their max_mails_per_day (None: DEFAULT_MAX_MAILS_PER_DAY)
    must: bool  # a digest or critical mail: counted, never refused


def limit_of(limit: int | None) -> int:
    """The limit in force (0: none) for a stored max_mails_per_day."""
    return limit if limit is not None else max(0, config.get().default_max_mails_per_day)


def limited(items: list[T], default_limit: int) -> list[T]:
    """Of claimed rows or runs (each with a `max_mails_per_day`), those a limit applies to: all of
    them (a stored 0 excepted) when DEFAULT_MAX_MAILS_PER_DAY is set, else those with a limit of
    their own — so a deployment without budgets builds nothing per mail."""
    if default_limit > 0:
        return [item for item in items if item.max_mails_per_day != 0]  # type: ignore[attr-defined]
    return [item for item in items if item.max_mails_per_day]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Spent:
    refused: set[int]  # subscribers whose mail could wait and must: their day's budget is spent
    counted: dict[int, date]  # subscriber: the local day their mail was counted on (what refund() takes)


def spend(cur: db.Cursor, wanted: list[Spend], now: datetime) -> Spent:
    """Count one mail for each subscriber in `wanted` (each at most once), in the caller's
    transaction. Subscribers without a limit are not counted and never refused; nothing is asked of
    Postgres when none has one."""
    limited = [w for w in wanted if limit_of(w.limit) > 0]
    if not limited:
        return Spent(set(), {})
    ids = [w.subscriber_id for w in limited]
    if len(set(ids)) != len(ids):
        raise ValueError("spend: one mail per subscriber per call")
    days = {zone: today(now, zone) for zone in {w.timezone for w in limited}}  # once per zone
    params = {
        "ids": pg_array(ids),
        "days": [days[w.timezone] for w in limited],
        "caps": [None if w.must else limit_of(w.limit) for w in limited],
    }
    cur.execute(_SPEND, params)
    taken = {row[0] for row in cur.fetchall()}
    return Spent(
        {w.subscriber_id for w in limited if w.subscriber_id not in taken},
        {w.subscriber_id: days[w.timezone] for w in limited if w.subscriber_id in taken},
    )


def refund(cur: db.Cursor, counted: list[tuple[int, date]]) -> None:
    """[(subscriber_id, day)]: mails counted on that day that did not go."""
    if counted:
        cur.execute(_REFUND, (pg_array([sid for sid, _ in counted]), [day for _, day in counted]))


def spent_today(subscriber_id: int, now: datetime) -> tuple[int, int]:
    """(mails counted in the subscriber's local day, their limit; 0: none)."""
    params = {"id": subscriber_id, "now": now, "default_limit": max(0, config.get().default_max_mails_per_day)}
    rows = db.query(_SPENT_TODAY, params)
    return (int(rows[0][0] or 0), int(rows[0][1] or 0)) if rows else (0, 0)


def next_day(now: datetime, zone_name: str) -> datetime:
    """When the subscriber's next local day begins (UTC; DST-safe: a midnight that does not exist is
    the first valid minute after it)."""
    zone = timezones.load(zone_name)
    return quiet_hours.at_wall_clock(now.astimezone(zone).date() + timedelta(days=1), time(0, 0), zone)


def today(now: datetime, zone_name: str) -> date:
    return now.astimezone(timezones.load(zone_name)).date()
