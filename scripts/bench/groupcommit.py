"""The group-commit writer (app/platform/groupcommit.py) against what a user would write instead: each
request inserts its own rows with psycopg2's execute_values on a pooled connection and commits.

    .venv/bin/python scripts/bench/groupcommit.py [--seconds 5] [--threads 32]

Same rows, same INSERT … ON CONFLICT (app/ingest.insert_rows), same table, in process (no HTTP),
so the figure is the writer's alone: requests/s and events/s for single-event requests from
`--threads` concurrent callers (the API's hot case), and for 500-event batches. Every request
waits for its own commit in both (a 2xx means committed).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

from psycopg2.pool import ThreadedConnectionPool  # noqa: E402

from app.platform import config, db, migrate  # noqa: E402
from digest import ingest  # noqa: E402
from scripts.bench.shared import record  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_groupcommit")
    return p.parse_args()


def rows(n: int) -> list[tuple]:
    return [
        ("bench", uuid.uuid4().hex, f"u{i % 1000}", "like", "post", f"p{i % 50}", "a1", "Ann", "{}", None)
        for i in range(n)
    ]


def drive(submit, threads: int, seconds: float, size: int) -> tuple[float, float]:
    """(requests/s, events/s) with `threads` callers each submitting `size`-row requests."""
    done = [0] * threads
    stop = time.monotonic() + seconds

    def caller(k):
        while time.monotonic() < stop:
            submit(rows(size))
            done[k] += 1

    workers = [threading.Thread(target=caller, args=(k,)) for k in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    return sum(done) / elapsed, sum(done) * size / elapsed


def main() -> None:
    args = parse_args()
    migrate.migrate(args.database_url)
    config.override(database_url=args.database_url)
    db.init(args.database_url)
    writer = ingest.new_writer(args.database_url)
    pool = ThreadedConnectionPool(1, args.threads, args.database_url)

    def ours(batch):
        writer.submit(batch, size=len(batch)).result(timeout=30)

    def plain(batch):
        conn = pool.getconn()
        try:
            with db.transaction(conn) as cur:
                ingest.insert_rows(cur, [batch])
        finally:
            pool.putconn(conn)

    print(
        f"group commit vs execute_values on a pool: {args.threads} callers, {args.seconds:.0f} s per phase, "
        f"{os.cpu_count()} CPUs"
    )
    for size in (1, 500):
        threads = args.threads if size == 1 else 4
        results = {}
        for name, fn in (("ours", ours), ("plain", plain)):
            db.query("TRUNCATE digest_events")
            results[name] = drive(fn, threads, args.seconds, size)
            print(
                f"  {size:>3}-event requests, {threads:>2} callers, {name:<5}: "
                f"{results[name][0]:>9,.0f} requests/s {results[name][1]:>10,.0f} events/s"
            )
        print(f"  ratio ours/plain at {size}-event requests: {results['ours'][1] / results['plain'][1]:.1f}x")
        record(
            "group-commit writer (in process, no HTTP)",
            f"events/s, {size}-event requests, {threads} callers",
            results["ours"][1],
            "events/s",
            baseline=results["plain"][1],
            baseline_label="execute_values + commit per request on a pool",
            events_per_request=size,
            callers=threads,
            seconds=args.seconds,
            requests_per_s=round(results["ours"][0], 1),
            baseline_requests_per_s=round(results["plain"][0], 1),
        )
    pool.closeall()


if __name__ == "__main__":
    main()
