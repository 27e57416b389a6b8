"""Migrations 0600-0602 (the canonical address, app/subscribers/rekey.py) on a seeded database, while a writer
keeps updating subscribers: how long each takes, and the longest the writer waited meanwhile.

    .venv/bin/python scripts/bench/rekey.py [--rows 200000] [--db notify_bench_rekey]

Seeds --rows subscribers (one in 20 with a Unicode domain or a full-width local part), --rows
webhook_events and --rows/20 suppressions (a tenth of them colliding once canonical) the way the
application stored them before 0600, then applies 0600-0602 and runs `rekey` once more (the no-op
pass `python -m app rekey-addresses` costs). The database is created and dropped here.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402

from app.platform import config, migrate  # noqa: E402
from app.subscribers import rekey  # noqa: E402
from scripts.bench.partition_migration import migrate_until  # noqa: E402

config.reload()
BASE = "postgresql://localhost"


def sql(url, statement, params=None):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(statement, params)
        out = cur.fetchall() if cur.description else None
    conn.close()
    return out


def seed(url: str, n: int) -> None:
    sql(
        url,
        "INSERT INTO subscribers (user_id, email) SELECT 'u' || g, CASE "
        "WHEN g %% 40 = 0 THEN 'User' || g || '@Bücher' || (g %% 7) || '.example' "
        "WHEN g %% 40 = 1 THEN 'ｕｓｅｒ' || g || '@example.com' "
        "ELSE 'User' || g || '@Example.com' END FROM generate_series(1, %s) g",
        (n,),
    )
    sql(
        url,
        "INSERT INTO webhook_events (sg_event_id, event, email, payload) SELECT 'sg-' || g, 'delivered', "
        "'User' || (g %% %s) || '@Example.com', '{}' FROM generate_series(1, %s) g",
        (n, n),
    )
    sql(
        url,
        "INSERT INTO suppressions (email, reason) SELECT CASE WHEN g %% 10 = 0 THEN 'ｕｓｅｒ' || g "
        "ELSE 'user' || g END || '@example.com', 'bounce' FROM generate_series(1, %s) g",
        (n // 20,),
    )
    sql(
        url,
        "INSERT INTO suppressions (email, reason) SELECT 'user' || g || '@example.com', 'spamreport' "
        "FROM generate_series(1, %s) g WHERE g %% 10 = 0",
        (n // 20,),
    )
    sql(url, "ANALYZE")


class Writer(threading.Thread):
    """Single-row updates of random subscribers, back to back, each timed."""

    def __init__(self, url: str, n: int):
        super().__init__(daemon=True)
        self.url, self.n, self.stop, self.latencies = url, n, threading.Event(), []

    def run(self) -> None:
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stop.is_set():
                started = time.perf_counter()
                cur.execute(
                    "UPDATE subscribers SET soft_bounce_count = soft_bounce_count + 1 WHERE user_id = %s",
                    (f"u{random.randint(1, self.n)}",),
                )
                self.latencies.append(time.perf_counter() - started)
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--db", default="notify_bench_rekey")
    args = parser.parse_args()
    url = f"{BASE}/{args.db}"
    sql(f"{BASE}/postgres", f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
    try:
        migrate_until(url, "0599")
        seed(url, args.rows)
        writer = Writer(url, args.rows)
        writer.start()
        started = time.perf_counter()
        applied = migrate.migrate(url)
        total = time.perf_counter() - started
        writer.stop.set()
        writer.join()
        durations = dict(sql(url, "SELECT version, duration_ms FROM schema_migrations WHERE version >= '0600'"))
        print(
            f"{args.rows:,} subscribers, {args.rows:,} webhook_events, {args.rows // 20 + args.rows // 200:,} "
            f"suppressions; applied {', '.join(applied)} in {total:.1f} s"
        )
        for version in sorted(durations):
            print(f"  {version}: {durations[version] / 1000:.2f} s")
        keyed = args.rows * 2 / (durations["0601"] / 1000)
        print(f"  0601 keyed {keyed:,.0f} rows/s (subscribers + webhook_events)")
        lat = sorted(writer.latencies)
        print(
            f"  concurrent writer: {len(lat):,} updates, median {lat[len(lat) // 2] * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms"
        )
        conn = psycopg2.connect(url)
        conn.autocommit = True
        started = time.perf_counter()
        counts = rekey.rekey(conn)
        conn.close()
        print(f"  rekey again (nothing to change: {counts}): {time.perf_counter() - started:.1f} s")
    finally:
        sql(f"{BASE}/postgres", f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
