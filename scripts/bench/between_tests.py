"""What emptying the tables between tests costs: the dirty check, TRUNCATE, and DELETE with triggers
off plus setval (tests/conftest.py, docs/testing.md), with synchronous_commit on and off.

    .venv/bin/python scripts/bench/between_tests.py [--url postgresql://localhost/notify_bench_between] [-n 30]

Migrates a scratch database of its own (dropped afterwards) and prints the median and minimum of n
calls of each way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("APP_ENV", "test")

from app.platform import db, migrate

DIRTY_SQL = " UNION ".join(
    [f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t})" for t in db.ALL_TABLES]
    + ["SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' AND last_value IS NOT NULL"]
)
FILL = (
    "INSERT INTO api_keys (name, scope, key_prefix, key_hash) "
    "SELECT 'k' || g, 'admin', 'p', decode(md5(g::text), 'hex') FROM generate_series(1, 3) g"
)
DELETE = (
    "BEGIN; SET LOCAL session_replication_role = replica; DELETE FROM api_keys; "
    "SELECT setval(pg_get_serial_sequence('api_keys', 'id'), 1, false); COMMIT"
)


def measure(label: str, fn, n: int) -> None:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        took.append((time.perf_counter() - started) * 1000)
    print(f"{label:<55} median {statistics.median(took):7.1f} ms   min {min(took):7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://localhost/notify_bench_between")
    parser.add_argument("-n", type=int, default=30)
    args = parser.parse_args()
    migrate.migrate(args.url)
    conn = db.connect_raw(args.url, autocommit=True)
    try:
        cur = conn.cursor()
        measure("which tables are dirty (nothing is)", lambda: (cur.execute(DIRTY_SQL), cur.fetchall()), args.n)
        everything = "TRUNCATE " + ", ".join(db.ALL_TABLES) + " RESTART IDENTITY CASCADE"
        measure(f"TRUNCATE all {len(db.ALL_TABLES)} tables, one statement", lambda: cur.execute(everything), args.n)
        for sync in ("on", "off"):
            cur.execute(f"SET synchronous_commit = {sync}")
            measure(
                f"synchronous_commit {sync}: 3 rows in, TRUNCATE",
                lambda: (cur.execute(FILL), cur.execute("TRUNCATE api_keys RESTART IDENTITY CASCADE")),
                args.n,
            )
            measure(
                f"synchronous_commit {sync}: 3 rows in, DELETE + setval",
                lambda: (cur.execute(FILL), cur.execute(DELETE)),
                args.n,
            )
    finally:
        conn.close()
        admin = db.connect_raw(args.url.rsplit("/", 1)[0] + "/postgres", autocommit=True)
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db.database_name(args.url)}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()
