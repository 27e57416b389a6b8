"""Operator dashboard benchmark: how long the /admin figures take on big tables.

    .venv/bin/python scripts/bench/admin_dashboard.py                  # 30 days at 100,000 digests/day
    .venv/bin/python scripts/bench/admin_dashboard.py --per-day 20000

Loads 30 days of history — sent digest runs, newsletter mails, opens and clicks (email_link_history,
about 35 % of mails, one click in four), bounces and complaints (webhook_events) — then times
app.web.admin.stats.compute() for the 24 h and 7 d ranges (the work behind one uncached dashboard
view: four statements), best of 3. The baseline is the same statements with the dashboard's
partial indexes (sql/migrations/0531) dropped: what every view would cost without them.
email_link_history and webhook_events are plain tables here: time partitions (by occurred_at /
received_at) prune them to the window, so a partitioned deployment reads less, not more.
Its own database (notify_bench_admin); 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--per-day", type=int, default=100_000, help="digests sent per day (newsletter mails: half as many)")
p.add_argument("--days", type=int, default=30)
p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_admin")
args = p.parse_args()
if urlparse(args.database_url).hostname not in ("127.0.0.1", "localhost"):
    sys.exit("the benchmark runs against 127.0.0.1 only")
os.environ.update(APP_ENV="development", DATABASE_URL=args.database_url, LOG_LEVEL="WARNING")

from app.platform import config, db, migrate  # noqa: E402
from app.web.admin import stats  # noqa: E402

config.reload()

LOAD_SQL = [
    "TRUNCATE subscribers, digest_runs, newsletters, email_log, email_link_history, webhook_events RESTART IDENTITY "
    "CASCADE",
    "INSERT INTO subscribers (user_id, email) SELECT 'u' || g, 'u' || g || '@bench.test' "
    "FROM generate_series(1, %(per_day)s) g",
    # one digest per subscriber per day, sent 5-120 s after its slot
    "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status, completed_at) "
    "SELECT s, 'daily', (now() - d * interval '1 day')::date, slot, 'sent', "
    "slot + (5 + random() * 115) * interval '1 s' "
    "FROM generate_series(0, %(days)s - 1) d, generate_series(1, %(per_day)s) s, "
    "LATERAL (SELECT now() - d * interval '1 day' - random() * interval '1 day' AS slot) x",
    "INSERT INTO newsletters (subject, html, status) SELECT 'n' || d, '<p>x</p>', 'done' "
    "FROM generate_series(0, %(days)s - 1) d",
    "INSERT INTO email_log (newsletter_id, subscriber_id, email, status, sent_at) "
    "SELECT d + 1, s, 'u' || s || '@bench.test', 'sent', now() - d * interval '1 day' - random() * interval '2 hours' "
    "FROM generate_series(0, %(days)s - 1) d, generate_series(1, %(per_day)s / 2) s",
    "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, is_machine, occurred_at) "
    "SELECT CASE WHEN random() < 0.25 THEN 'click' ELSE 'open' END, 'digest', id, subscriber_id, random() < 0.05, "
    "completed_at + random() * interval '6 hours' FROM digest_runs WHERE random() < 0.35",
    "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, is_machine, occurred_at) "
    "SELECT CASE WHEN random() < 0.25 THEN 'click' ELSE 'open' END, 'newsletter', newsletter_id, subscriber_id, "
    "random() < 0.05, sent_at + random() * interval '6 hours' FROM email_log WHERE random() < 0.35",
    "INSERT INTO webhook_events (sg_event_id, event, email, payload, received_at, processed_at) "
    "SELECT 'sg' || g, CASE WHEN random() < 0.8 THEN 'delivered' WHEN random() < 0.9 THEN 'bounce' "
    "ELSE 'spamreport' END, 'x@bench.test', '{}', now() - random() * %(days)s * interval '1 day', now() "
    "FROM generate_series(1, %(per_day)s * %(days)s / 10) g",
    "VACUUM ANALYZE",
]
INDEXES = {
    "digest_runs_sent_idx": "CREATE INDEX digest_runs_sent_idx ON digest_runs (completed_at) "
    "INCLUDE (scheduled_for, id) WHERE status = 'sent'",
    "email_log_sent_idx": "CREATE INDEX email_log_sent_idx ON email_log (sent_at) "
    "INCLUDE (newsletter_id, subscriber_id) WHERE status = 'sent'",
}


def timed(name: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        d = stats.compute(name)
        best = min(best, time.perf_counter() - started)
        assert not d.unavailable, d.unavailable
    return best


def main() -> None:
    migrate.migrate(args.database_url)
    db.init(args.database_url)
    started = time.perf_counter()
    conn = db.connect_raw(args.database_url, autocommit=True)
    with conn.cursor() as cur:
        for sql in LOAD_SQL:
            cur.execute(sql, {"per_day": args.per_day, "days": args.days})
        cur.execute(
            "SELECT (SELECT count(*) FROM digest_runs), (SELECT count(*) FROM email_log), "
            "(SELECT count(*) FROM email_link_history), (SELECT count(*) FROM webhook_events)"
        )
        runs, mails, hits, events = cur.fetchone()
    print(
        f"loaded {runs:,} digest runs, {mails:,} newsletter mails, {hits:,} opens/clicks, {events:,} webhook "
        f"events in {time.perf_counter() - started:.0f} s"
    )
    with_index = {name: timed(name) for name in stats.RANGES}
    with conn.cursor() as cur:
        for index in INDEXES:
            cur.execute(f"DROP INDEX {index}")
    without = {name: timed(name) for name in stats.RANGES}
    with conn.cursor() as cur:
        for sql in INDEXES.values():
            cur.execute(sql)
    conn.close()
    from scripts.bench.shared import record

    for name in stats.RANGES:
        print(
            f"{name:>3}: {with_index[name] * 1000:7.0f} ms with the partial indexes, "
            f"{without[name] * 1000:7.0f} ms without (best of 3; four statements)"
        )
        record(
            "operator dashboard figures, uncached",
            f"last {name}",
            with_index[name] * 1000,
            "ms",
            baseline=without[name] * 1000,
            baseline_label="same queries without the sent-mail indexes",
            higher_is_better=False,
            digests_per_day=args.per_day,
            days=args.days,
        )


if __name__ == "__main__":
    main()
