"""The newsletter claim with and without local_time (app/newsletter/schedule.py): what skipping rows
not yet due costs the claim, the outbox builder, and the scheduler tick's re-kick question.

    .venv/bin/python scripts/bench/local_time_claim.py [--recipients 200000] [--db notify_bench_local_time]

Seeds --recipients subscribers, every other one in Asia/Tokyo and the rest in UTC, and sends one
newsletter to all of them now and one at a local_time that has come in UTC and is 9 h away in Tokyo.
Claims run in a transaction rolled back, so each is measured on the same rows. The database is
created and dropped here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402

from app.newsletter import outbox, reclaim, rows, service  # noqa: E402
from app.platform import config, db, migrate  # noqa: E402

BASE = "postgresql://localhost"
REPEATS = 5
# Nothing is sent here: the builder must not enqueue send chains (to whatever Redis REDIS_URL names).
outbox._start_sending = lambda newsletter_id: None


def admin(statement: str) -> None:
    conn = psycopg2.connect(f"{BASE}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(statement)
    conn.close()


def median_ms(conn, sql: str, params) -> tuple[int, float]:
    times, found = [], 0
    for _ in range(REPEATS):
        with conn.cursor() as cur:
            started = time.perf_counter()
            cur.execute(sql, params)
            found = len(cur.fetchall())
            times.append((time.perf_counter() - started) * 1000)
        conn.rollback()
    return found, statistics.median(times)


def newsletter(local: bool) -> tuple[int, float]:
    values, _ = service.validate_new({"subject": "Hi {{name}}", "html": "<p>Hello {{name}}</p>"})
    nl = service.create(values)
    at = (datetime.now(UTC) - timedelta(hours=6)).time().replace(second=0, microsecond=0) if local else None
    db.query(
        "UPDATE newsletters SET status = 'queued', audience = '{\"kind\": \"all\"}', local_time = %s, "
        "send_requested_at = now() - interval '12 hours' WHERE id = %s",
        (at, nl),
    )
    started = time.perf_counter()
    outbox.create_outbox(nl)
    return nl, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipients", type=int, default=200_000)
    parser.add_argument("--db", default="notify_bench_local_time")
    args = parser.parse_args()
    url = f"{BASE}/{args.db}"
    admin(f"DROP DATABASE IF EXISTS {args.db}")
    admin(f"CREATE DATABASE {args.db}")
    try:
        config.override(database_url=url, newsletter_send_chains=1)
        migrate.migrate(url)
        db.init(url)
        db.query(
            "INSERT INTO subscribers (user_id, email, canonical_email, name, timezone) "
            "SELECT 'u' || g, 'user' || g || '@example.com', 'user' || g || '@example.com', 'User ' || g, "
            "CASE WHEN mod(g, 2) = 0 THEN 'Asia/Tokyo' ELSE 'UTC' END FROM generate_series(1, %s) g",
            (args.recipients,),
        )
        conn = psycopg2.connect(url)
        print(f"{args.recipients:,} recipients, half of them due (UTC), half 9 h away (Tokyo)")
        for local in (False, True):
            nl, built = newsletter(local)
            db.query("UPDATE newsletters SET status = 'sending' WHERE id = %s", (nl,))
            db.query("ANALYZE email_log")
            label = "local_time" if local else "now"
            found, ms = median_ms(conn, rows.CLAIM, {"nl": nl, "limit": 1000, "after": 0})
            print(f"{label:>10}: outbox built in {built:.1f} s; a claim of 1,000 from the start {ms:.1f} ms ({found})")
            if local:
                db.query("UPDATE email_log SET status = 'sent' WHERE newsletter_id = %s AND not_before <= now()", (nl,))
                db.query("VACUUM ANALYZE email_log")
                found, ms = median_ms(conn, rows.CLAIM, {"nl": nl, "limit": 1000, "after": 0})
                print(f"{'':>10}  the due half sent: a claim that finds none of the rest {ms:.1f} ms ({found})")
                found, ms = median_ms(conn, reclaim.SENDING_WITH_DUE_ROWS, None)
                print(f"{'':>10}  the tick's question, which newsletters have due rows: {ms:.2f} ms")
        conn.close()
    finally:
        admin(f"DROP DATABASE IF EXISTS {args.db} WITH (FORCE)")  # the pool still holds connections
    return 0


if __name__ == "__main__":
    sys.exit(main())
