"""Database time per stored event, before and after the partitioning of digest_events: the same
5,000-event group commits (digest/ingest.py insert_rows' statement shape) into

  before   the schema before 0520: a plain table, INSERT ... ON CONFLICT (source, producer_id)
  after    the full schema: monthly partitions, the key claimed by digest_events_claim_key()
           (migration 0520), the application's INSERT as shipped (app/events.INSERT_SQL)
  after+oc the same with ON CONFLICT DO NOTHING appended (why the application dropped it)
  nofeed   the full schema before the feed summary (up to 0679): what feed_entities' insert
           trigger (migration 0680) costs is after - nofeed

    .venv/bin/python scripts/bench/event_insert.py [--rounds 40] [--existing 200000]

Rounds alternate between the variants so machine noise hits them alike; each database first gets
--existing events so the indexes are not trivially small. One in ten events of a round repeats an
earlier key (a duplicate). Databases notify_bench_insert_{before,nofeed,after} on postgresql://127.0.0.1,
created and dropped here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

from app.platform import config, migrate  # noqa: E402
from digest import events  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
BASE = "postgresql://127.0.0.1"
OLD_SQL = events.INSERT_SQL.replace("RETURNING", "ON CONFLICT (source, producer_id) DO NOTHING RETURNING")
WITH_OC = events.INSERT_SQL.replace("RETURNING", "ON CONFLICT DO NOTHING RETURNING")


def fresh(name: str, last: str | None) -> str:
    admin = psycopg2.connect(f"{BASE}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    url = f"{BASE}/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        real = migrate.discover
        if last:
            for m in real():
                if m.version <= last:
                    shutil.copy(m.path, Path(tmp) / m.path.name)
            migrate.discover = lambda directory=Path(tmp): real(directory)
        try:
            migrate.migrate(url)
        finally:
            migrate.discover = real
    return url


def drop(name: str) -> None:
    admin = psycopg2.connect(f"{BASE}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def rows(tag: str, n: int, repeat_of: str | None) -> list[tuple]:
    out = [
        (
            "bench",
            f"{tag}-{i}",
            f"user-{i % 5000}",
            "likes",
            "post",
            f"p{i % 97}",
            f"a{i % 31}",
            "Actor",
            '{"title": "A post title"}',
            None,
        )
        for i in range(n)
    ]
    if repeat_of:
        out[::10] = [("bench", f"{repeat_of}-{i + 1}", *r[2:]) for i, r in zip(range(0, n, 10), out[::10])]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--events", type=int, default=5000, help="events per group commit")
    p.add_argument("--existing", type=int, default=200_000)
    args = p.parse_args()
    names = {
        "before": "notify_bench_insert_before",
        "nofeed": "notify_bench_insert_nofeed",
        "after": "notify_bench_insert_after",
    }
    conns = {
        "before": psycopg2.connect(fresh(names["before"], "0519")),
        "nofeed": psycopg2.connect(fresh(names["nofeed"], "0679")),
        "after": psycopg2.connect(fresh(names["after"], None)),
    }
    variants = {
        "before": ("before", OLD_SQL),
        "nofeed": ("nofeed", events.INSERT_SQL),
        "after": ("after", events.INSERT_SQL),
        "after+oc": ("after", WITH_OC),
    }
    for conn in conns.values():
        with conn.cursor() as cur:
            for start in range(0, args.existing, 50_000):
                psycopg2.extras.execute_values(
                    cur,
                    events.INSERT_SQL,
                    rows(f"seed{start}", 50_000, None),
                    template=events.INSERT_TEMPLATE,
                    page_size=50_000,
                )
            conn.commit()
            cur.execute("ANALYZE")
        conn.commit()
    times: dict[str, list[float]] = {v: [] for v in variants}
    last_tag: dict[str, str | None] = dict.fromkeys(variants)
    for _ in range(args.rounds):
        for variant, (db, sql) in variants.items():
            tag = uuid.uuid4().hex[:8]
            batch = rows(tag, args.events, last_tag[variant])
            conn = conns[db]
            with conn.cursor() as cur:
                started = time.perf_counter()
                stored = psycopg2.extras.execute_values(
                    cur, sql, batch, template=events.INSERT_TEMPLATE, page_size=len(batch), fetch=True
                )
                conn.commit()
                times[variant].append((time.perf_counter() - started) * 1e6 / len(batch))
            expected = len(batch) - (len(batch[::10]) if last_tag[variant] else 0)
            assert len(stored) == expected, (variant, len(stored), expected)
            last_tag[variant] = tag
    for conn in conns.values():
        conn.close()
    for name in names.values():
        drop(name)
    print(
        f"database time per event, {args.events}-event group commits, {args.rounds} rounds "
        f"({os.cpu_count()} cores, 10 % duplicates, {args.existing:,} events stored first):"
    )
    for variant, values in times.items():
        values.sort()
        print(f"  {variant:<9} median {statistics.median(values):6.1f} us   p25 {values[len(values) // 4]:6.1f} us")
    for label, variant, baseline, baseline_label in (
        (
            "partitioned + key trigger (before the feed summary)",
            "nofeed",
            "before",
            "plain table, unique key (before 0520)",
        ),
        (
            "partitioned + key trigger + feed summary trigger",
            "after",
            "nofeed",
            "the same without the feed summary (before 0680)",
        ),
    ):
        record(
            "stored event, database time",
            label,
            statistics.median(times[variant]),
            "us",
            baseline=statistics.median(times[baseline]),
            baseline_label=baseline_label,
            higher_is_better=False,
            group_commit=args.events,
            rounds=args.rounds,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
