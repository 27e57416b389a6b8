"""The mail budget: at most N mails in a subscriber's local day (issue 40), the one owner of `mail_budget`.

A subscriber's limit is their `max_mails_per_day`, else DEFAULT_MAX_MAILS_PER_DAY; 0 is no limit
(nothing is counted). Every mail that goes to them counts — digests, send-now mail, critical mail,
newsletters — over their local day (their zone's midnight to midnight). What may be refused is only
what can wait: send-now mail (it folds into the next digest) and newsletters (held to the next local
day); digests and critical mail always go and still count.

`spend` is the one way to count. It is exact under concurrency: the rows are locked in subscriber
order and each count is decided on the row as the last committed spender left it, so two workers
spending for one subscriber never both take the last mail (a READ COMMITTED UPDATE re-reads a row
it had to wait for before it applies its condition). A mail is counted when it is claimed to be
sent; one that then fails stays counted, so a day's mails never exceed the limit (they may fall
short of it when sends fail).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from app.platform import config, db, timezones
from app.platform.db import pg_array
from app.subscribers import quiet_hours

# The limit in force for subscriber row `s` (0: none).
LIMIT = "coalesce({s}.max_mails_per_day, %(default_limit)s::int)"

# First every counted subscriber has a row (a new subscriber's first mail ever: inserted as 0 spent
# on today, so the decision below is always an UPDATE of a row both spenders lock); then one UPDATE
# decides and counts. Rows locked in subscriber order: two batches that share subscribers never
# deadlock.
_ENSURE = f"""
INSERT INTO mail_budget (subscriber_id, day, spent)
SELECT s.id, (%(now)s::timestamptz AT TIME ZONE s.timezone)::date, 0
FROM subscribers s
WHERE s.id = ANY (%(ids)s::bigint[]) AND {LIMIT.format(s="s")} > 0
ORDER BY s.id
ON CONFLICT (subscriber_id) DO NOTHING
"""

_SPEND = f"""
WITH v AS (
    SELECT s.id, v.must, {LIMIT.format(s="s")} AS cap, (%(now)s::timestamptz AT TIME ZONE s.timezone)::date AS today
    FROM unnest(%(ids)s::bigint[], %(must)s::boolean[]) AS v(id, must)
    JOIN subscribers s ON s.id = v.id
    WHERE {LIMIT.format(s="s")} > 0
), locked AS MATERIALIZED (
    SELECT b.subscriber_id FROM mail_budget b
    WHERE b.subscriber_id IN (SELECT id FROM v)
    ORDER BY b.subscriber_id
    FOR UPDATE OF b
), counted AS (
    UPDATE mail_budget b SET
        spent = CASE WHEN b.day = v.today THEN b.spent + 1 ELSE 1 END,
        day = v.today
    FROM v JOIN locked l ON l.subscriber_id = v.id
    WHERE b.subscriber_id = v.id AND (v.must OR b.day <> v.today OR b.spent < v.cap)
    RETURNING b.subscriber_id
)
SELECT v.id FROM v WHERE NOT v.must AND v.id NOT IN (SELECT subscriber_id FROM counted)
"""

_SPENT_TODAY = f"""
SELECT CASE WHEN b.day = (%(now)s::timestamptz AT TIME ZONE s.timezone)::date THEN b.spent ELSE 0 END,
       {LIMIT.format(s="s")}
FROM subscribers s LEFT JOIN mail_budget b ON b.subscriber_id = s.id
WHERE s.id = %(id)s
"""


@dataclass(frozen=True)
class Spend:
    subscriber_id: int
    must: bool  # a digest or critical mail: counted, never refused


def spend(cur: db.Cursor, wanted: list[Spend], now: datetime) -> set[int]:
    """Count one mail for each subscriber in `wanted` (each at most once), in the caller's
    transaction. Returns the subscribers whose mail was refused: their day's budget is spent and
    the mail could wait. Subscribers without a limit are not counted and never refused."""
    if not wanted:
        return set()
    ids = [w.subscriber_id for w in wanted]
    if len(set(ids)) != len(ids):
        raise ValueError("spend: one mail per subscriber per call")
    params = {"ids": pg_array(ids), "now": now, "default_limit": max(0, config.get().default_max_mails_per_day)}
    cur.execute(_ENSURE, params)
    cur.execute(_SPEND, {**params, "must": [w.must for w in wanted]})
    return {row[0] for row in cur.fetchall()}


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
