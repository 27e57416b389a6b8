"""The dashboard's figures: hour by hour over the last 24 hours or 7 days (UTC hours).

Every statement reads a bounded time window on a timestamp column, so it stays cheap however old
and large the tables are:
  * mails sent — digest_runs.completed_at and email_log.sent_at of sent rows (partial indexes
    digest_runs_sent_idx, email_log_sent_idx: sql/migrations/0531, read index-only);
  * opens and clicks — email_link_history.occurred_at within the window (a predicate on the column
    time partitions are cut by), joined to the mails sent in the window: the open rate of an hour
    is the share of the mails *sent that hour* that have been opened since (a click counts as an
    open: many clients block the pixel); the click rate likewise. Machine traffic (scanners,
    prefetch) is left out. Recent hours rise as people read their mail.
  * bounces and complaints — SendGrid `bounce` (blocks included) and `spamreport` events by
    webhook_events.received_at;
  * digest lateness — completed_at − scheduled_for of sent runs, as notify_digest_lateness_seconds
    measures it (digest/runs.py mark_sent), p50 and p95 per hour and over the window;
  * mails held and released — digest runs held by their subscriber's quiet hours, by the hour they
    were first held (digest_runs.held_at), and those of them sent, by the hour they went out
    (completed_at): partial indexes digest_runs_held_idx and digest_runs_released_idx
    (sql/migrations/0760), which hold only the held runs, a small share of all.
email_link_history and webhook_events get no index of ours on their timestamp: time partitions are
pruned by the window predicates (checked against a partitioned copy of both tables); an
unpartitioned table is read whole. The cost is linear in the mails of the window
(scripts/bench/admin_dashboard.py; BENCHMARKS.md, "operator dashboard figures").
Each statement runs under its own STATEMENT_TIMEOUT: a figure that cannot be had in time is shown
as unavailable, the others still are. Results are cached per range for ADMIN_CACHE_SECONDS.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from app.platform import config, db

log = logging.getLogger("app.web.admin.stats")

RANGES = {"24h": 24, "7d": 24 * 7}  # name -> hours
RANGE_LABELS = {"24h": "last 24 hours", "7d": "last 7 days"}
DEFAULT_RANGE = "24h"
STATEMENT_TIMEOUT = "10s"  # a 7 d view of a busy service takes seconds (scripts/bench/admin_dashboard.py)
KINDS = ("digest", "newsletter")


@dataclass(frozen=True)
class Window:
    name: str
    since: datetime  # inclusive, on the hour
    until: datetime  # exclusive: the end of the current hour
    hours: tuple[datetime, ...]

    @property
    def params(self) -> dict:
        return {"since": self.since, "until": self.until}


def window(name: str, now: datetime | None = None) -> Window:
    n = RANGES[name]
    now = now or datetime.now(UTC)
    until = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    since = until - timedelta(hours=n)
    return Window(name, since, until, tuple(since + timedelta(hours=i) for i in range(n)))


@dataclass
class Dashboard:
    window: Window
    computed_at: float = field(default_factory=time.time)
    sent: dict = field(default_factory=dict)  # kind -> [count per hour]
    opened: dict = field(default_factory=dict)  # kind -> [mails sent that hour and opened since]
    clicked: dict = field(default_factory=dict)
    bounces: list | None = None
    complaints: list | None = None
    lateness_p50: list | None = None  # seconds per hour (None: no digest sent that hour)
    lateness_p95: list | None = None
    lateness_total: tuple | None = None  # (p50, p95) over the window
    held: list | None = None  # digest runs first held by quiet hours, per hour (held_at)
    released: list | None = None  # held runs sent, per hour (completed_at)
    unavailable: list = field(default_factory=list)  # charts whose statement timed out

    def sent_per_hour(self) -> list[int] | None:
        return [sum(v) for v in zip(*self.sent.values())] if self.sent else None

    def rate(self, which: str, hour: int | None = None) -> float | None:
        """Share (0..1) of the mails sent (that hour, or in the window) that were opened/clicked."""
        hits = self.opened if which == "open" else self.clicked
        if not hits or not self.sent:
            return None
        index = range(len(self.window.hours)) if hour is None else (hour,)
        sent = sum(self.sent[k][i] for k in KINDS for i in index)
        return sum(hits[k][i] for k in KINDS for i in index) / sent if sent else None

    def rates(self, which: str) -> list[float | None] | None:
        if not (self.opened if which == "open" else self.clicked) or not self.sent:
            return None
        return [self.rate(which, i) for i in range(len(self.window.hours))]


_SENT_SQL = """
SELECT date_trunc('hour', completed_at, 'UTC'), 'digest', count(*) FROM digest_runs
WHERE status = 'sent' AND completed_at >= %(since)s AND completed_at < %(until)s GROUP BY 1
UNION ALL
SELECT date_trunc('hour', sent_at, 'UTC'), 'newsletter', count(*) FROM email_log
WHERE status = 'sent' AND sent_at >= %(since)s AND sent_at < %(until)s GROUP BY 1
"""

# Human opens/clicks that happened in the window, per mail (a digest is one run; a newsletter mail
# is one recipient of one newsletter), joined to the mails sent in the window (hash joins on the
# partial indexes' INCLUDEd columns). Two reads of the history, one per kind, measured faster than
# one MATERIALIZED read, whose row estimate then misleads the planner into a nested loop.
_ENGAGEMENT_SQL = """
WITH digest_hits AS (
    SELECT mail_id, bool_or(kind = 'click') AS clicked FROM email_link_history
    WHERE occurred_at >= %(since)s AND occurred_at < %(until)s AND mail_kind = 'digest' AND NOT is_machine
    GROUP BY mail_id
), newsletter_hits AS (
    SELECT mail_id, subscriber_id, bool_or(kind = 'click') AS clicked FROM email_link_history
    WHERE occurred_at >= %(since)s AND occurred_at < %(until)s AND mail_kind = 'newsletter' AND NOT is_machine
      AND subscriber_id IS NOT NULL
    GROUP BY mail_id, subscriber_id
)
SELECT date_trunc('hour', r.completed_at, 'UTC'), 'digest', count(*), count(*) FILTER (WHERE h.clicked)
FROM digest_runs r JOIN digest_hits h ON h.mail_id = r.id
WHERE r.status = 'sent' AND r.completed_at >= %(since)s AND r.completed_at < %(until)s GROUP BY 1
UNION ALL
SELECT date_trunc('hour', e.sent_at, 'UTC'), 'newsletter', count(*), count(*) FILTER (WHERE h.clicked)
FROM email_log e JOIN newsletter_hits h ON h.mail_id = e.newsletter_id AND h.subscriber_id = e.subscriber_id
WHERE e.status = 'sent' AND e.sent_at >= %(since)s AND e.sent_at < %(until)s GROUP BY 1
"""

_BOUNCES_SQL = """
SELECT date_trunc('hour', received_at, 'UTC'), count(*) FILTER (WHERE event = 'bounce'),
       count(*) FILTER (WHERE event = 'spamreport')
FROM webhook_events
WHERE received_at >= %(since)s AND received_at < %(until)s AND event IN ('bounce', 'spamreport')
GROUP BY 1
"""

# Per hour, and over the whole window (the empty grouping set: hour NULL).
_LATENESS_SQL = """
SELECT date_trunc('hour', completed_at, 'UTC') AS hour,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY lateness)
FROM (SELECT completed_at, greatest(0, extract(epoch FROM completed_at - scheduled_for)) AS lateness
      FROM digest_runs WHERE status = 'sent' AND completed_at >= %(since)s AND completed_at < %(until)s) sent
GROUP BY GROUPING SETS ((1), ())
"""

# Runs held by quiet hours (held_at: when first held; it stays set once sent), and the held runs
# that went out, by when (each branch reads its own small partial index).
_HELD_SQL = """
SELECT date_trunc('hour', held_at, 'UTC'), 'held', count(*) FROM digest_runs
WHERE held_at IS NOT NULL AND held_at >= %(since)s AND held_at < %(until)s GROUP BY 1
UNION ALL
SELECT date_trunc('hour', completed_at, 'UTC'), 'released', count(*) FROM digest_runs
WHERE status = 'sent' AND held_at IS NOT NULL AND completed_at >= %(since)s AND completed_at < %(until)s
GROUP BY 1
"""


def _run(sql: str, params: dict, what: str, unavailable: list) -> list[tuple] | None:
    try:
        with db.raw_cursor() as cur:
            cur.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
            cur.execute(sql, params)
            return cur.fetchall()
    except db.QueryCanceled:
        log.warning("dashboard: the %s figures took longer than %s; shown as unavailable", what, STATEMENT_TIMEOUT)
        unavailable.append(what)
        return None


def compute(name: str, now: datetime | None = None) -> Dashboard:
    """Every figure of the dashboard for one range, read now (no cache)."""
    w = window(name, now)
    index = {hour: i for i, hour in enumerate(w.hours)}
    n = len(w.hours)
    d = Dashboard(w)

    rows = _run(_SENT_SQL, w.params, "sent", d.unavailable)
    if rows is not None:
        d.sent = {kind: [0] * n for kind in KINDS}
        for hour, kind, count in rows:
            d.sent[kind][index[hour]] = count

    rows = _run(_ENGAGEMENT_SQL, w.params, "rates", d.unavailable)
    if rows is not None:
        d.opened, d.clicked = ({kind: [0] * n for kind in KINDS} for _ in range(2))
        for hour, kind, opened, clicked in rows:
            d.opened[kind][index[hour]] = opened
            d.clicked[kind][index[hour]] = clicked

    rows = _run(_BOUNCES_SQL, w.params, "bounces", d.unavailable)
    if rows is not None:
        d.bounces, d.complaints = [0] * n, [0] * n
        for hour, bounces, complaints in rows:
            d.bounces[index[hour]], d.complaints[index[hour]] = bounces, complaints

    rows = _run(_LATENESS_SQL, w.params, "lateness", d.unavailable)
    if rows is not None:
        d.lateness_p50, d.lateness_p95 = [None] * n, [None] * n
        d.lateness_total = (None, None)
        for hour, p50, p95 in rows:
            if hour is None:
                d.lateness_total = (p50, p95)
            else:
                d.lateness_p50[index[hour]], d.lateness_p95[index[hour]] = p50, p95

    rows = _run(_HELD_SQL, w.params, "held", d.unavailable)
    if rows is not None:
        d.held, d.released = [0] * n, [0] * n
        for hour, which, count in rows:
            (d.held if which == "held" else d.released)[index[hour]] = count
    return d


class _Cache:
    """Per range, the last Dashboard for ADMIN_CACHE_SECONDS. One computation at a time: the page
    and its four charts arrive together and share the first one's result (and the database sees
    at most one dashboard's statements at once per process)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, Dashboard] = {}

    def get(self, name: str) -> Dashboard:
        with self._lock:
            hit = self._entries.get(name)
            if hit is None or time.time() - hit.computed_at >= config.get().admin_cache_seconds:
                hit = self._entries[name] = compute(name)
            return hit

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


cache = _Cache()
