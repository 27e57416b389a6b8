"""Digest planner benchmark: how long a scheduler tick spends planning with N subscribers.

    .venv/bin/python scripts/bench/planner.py                       # 1,000,000 subscribers
    .venv/bin/python scripts/bench/planner.py --subscribers 200000

Subscribers are spread over 8 time zones and 24 local hours, daily and weekly. Measured:
  first tick      nobody planned yet (a fresh import): every subscriber gets a run
  idle tick       nothing due: what most ticks of the day cost
  hourly tick     one hour later: the subscribers whose slot passed get their next run
and the idle and hourly ticks of the naive planner measured in the same run (the previous design:
every tick joins every active subscriber and checks for an existing run of their next slot).
Its own database (notify_bench_planner); 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--subscribers", type=int, default=1_000_000)
p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_planner")
args = p.parse_args()
if urlparse(args.database_url).hostname not in ("127.0.0.1", "localhost"):
    sys.exit("the benchmark runs against 127.0.0.1 only")
os.environ.update(APP_ENV="development", DATABASE_URL=args.database_url, LOG_LEVEL="WARNING")

from app.platform import config, db, migrate  # noqa: E402
from digest import plan as digest_planner  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Los_Angeles",
    "Asia/Tokyo",
    "Asia/Kolkata",
    "Australia/Sydney",
    "America/Sao_Paulo",
]

# The previous planner, kept here as the baseline: one statement over every active subscriber.
NAIVE_SQL = """
INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for)
SELECT s.id, s.digest_cadence, v.period, v.slot
FROM unnest(%(tz)s::text[], %(cadence)s::text[], %(hour)s::int[], %(weekday)s::int[],
            %(period)s::date[], %(slot)s::timestamptz[]) AS v(tz, cadence, hour, weekday, period, slot)
JOIN subscribers s ON s.timezone = v.tz AND s.digest_cadence = v.cadence AND s.digest_hour = v.hour
                  AND (v.cadence = 'daily' OR s.digest_weekday = v.weekday)
WHERE s.unsubscribed_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM digest_runs r WHERE r.subscriber_id = s.id AND r.cadence = v.cadence
                  AND r.period = v.period AND r.status <> 'cancelled')
ON CONFLICT ON CONSTRAINT digest_runs_once_per_period DO NOTHING
"""


def naive_plan(now: datetime) -> int:
    cols = {k: [] for k in ("tz", "cadence", "hour", "weekday", "period", "slot")}
    for tz_name, cadence, hour, weekday in db.query(
        "SELECT DISTINCT timezone, digest_cadence, digest_hour, CASE WHEN digest_cadence = 'weekly' "
        "THEN digest_weekday ELSE 0 END FROM subscribers WHERE digest_cadence <> 'off' AND unsubscribed_at IS NULL"
    ):
        period, slot = digest_planner.next_slot(now, tz_name, cadence, hour, weekday)
        for key, value in zip(cols, (tz_name, cadence, hour, weekday, period, slot)):
            cols[key].append(value)
    with db.raw_cursor() as cur:
        cur.execute(NAIVE_SQL, cols)
        return cur.rowcount


def setup() -> None:
    migrate.migrate(args.database_url)  # creates the database if it is missing
    db.init(args.database_url)


def load(n: int) -> None:
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE " + ", ".join(db.ALL_TABLES) + " RESTART IDENTITY CASCADE")
        cur.execute(
            "INSERT INTO subscribers (user_id, email, timezone, digest_cadence, digest_hour, digest_weekday) "
            "SELECT 'p' || i, 'p' || i || '@example.test', (%s::text[])[1 + i %% %s], "
            "CASE WHEN i %% 5 = 0 THEN 'weekly' ELSE 'daily' END, (i / 7) %% 24, i %% 7 "
            "FROM generate_series(1, %s) AS i",
            (ZONES, len(ZONES), n),
        )
    vacuum()


def vacuum() -> None:
    db.query("VACUUM ANALYZE subscribers")
    db.query("VACUUM ANALYZE digest_runs")


def timed(fn, now) -> tuple[float, int]:
    started = time.perf_counter()
    planned = fn(now)
    return time.perf_counter() - started, planned


def measure(label: str, fn, now: datetime) -> list[tuple[str, float, int]]:
    load(args.subscribers)
    # The naive planner's first tick is not measured: with digest_runs empty when its statement
    # was planned, each NOT EXISTS scanned the rows the statement had inserted so far (200,000
    # subscribers took 225 s). Both start from ours; only the recurring ticks are compared.
    first = timed(digest_planner.plan, now)
    out = [("first tick", *first)] if fn is digest_planner.plan else []
    vacuum()  # autovacuum would have visited a million fresh rows before the next hour
    out.append(("idle tick", *timed(fn, now + timedelta(minutes=1))))
    out.append(("hourly tick", *timed(fn, now + timedelta(hours=1))))
    for what, seconds, planned in out:
        print(f"  {label:<6} {what:<12} {seconds * 1000:10.1f} ms  {planned:>9} runs planned")
    return out


def main() -> int:
    setup()
    now = datetime.now(UTC).replace(minute=5, second=0, microsecond=0)
    print(
        f"planner bench: {args.subscribers} subscribers, {len(ZONES)} time zones x 24 hours, "
        f"batch {config.get().digest_plan_batch}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    ours = measure("ours", digest_planner.plan, now)
    naive = measure("naive", naive_plan, now)
    print("\nsummary (ms per tick)")
    print(f"  first tick   ours {ours[0][1] * 1000:10.1f}")
    details = {"subscribers": args.subscribers, "time_zones": len(ZONES), "batch": config.get().digest_plan_batch}
    record(
        "digest planner tick",
        "first tick (fresh import)",
        ours[0][1] * 1000,
        "ms",
        higher_is_better=False,
        runs_planned=ours[0][2],
        **details,
    )
    for (what, t_ours, planned), (_, t_naive, naive_planned) in zip(ours[1:], naive):
        print(
            f"  {what:<12} ours {t_ours * 1000:10.1f}   naive {t_naive * 1000:10.1f}   "
            f"{t_naive / t_ours if t_ours else float('inf'):7.1f}x"
        )
        record(
            "digest planner tick",
            what,
            t_ours * 1000,
            "ms",
            baseline=t_naive * 1000,
            baseline_label="naive (joins every subscriber each tick)",
            higher_is_better=False,
            runs_planned=planned,
            baseline_runs_planned=naive_planned,
            **details,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
