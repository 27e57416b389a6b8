"""SendGrid webhook ingest benchmark: events/s in SendGrid-sized signed batches (1000 events) with
30% duplicates (redeliveries) from concurrent posters, against a real uvicorn on 127.0.0.1; then
checks that every unique event is stored exactly once (0 lost, 0 duplicated) and that the answers
add up. A naive baseline (scripts/bench/naive_webhook_app.py: per-request transaction, one INSERT
per event, threadpool) is measured in the same run. Loopback only, bounded in time.

    .venv/bin/python scripts/bench/webhook.py [--batches 200] [--posters 8]

Target (2 cores, poster included): >= 10,000 events/s.
Database: BENCH_DATABASE_URL (default postgresql://localhost/notify_bench_tracking); Redis for the
after-commit apply hints: BENCH_REDIS_URL (default redis://localhost:6379/13, flushed here).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import signal
import sys
import time
from pathlib import Path

import orjson
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
BENCH_DB = os.environ.get("BENCH_DATABASE_URL", "postgresql://localhost/notify_bench_tracking")
BENCH_REDIS = os.environ.get("BENCH_REDIS_URL", "redis://localhost:6379/13")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("APP_ENV", "development")

from app.platform import config, db, migrate  # noqa: E402
from scripts.bench.loadgen import build_request, free_port, run_load, start_server  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

BATCH = 1000
DUPLICATE_SHARE = 0.3


def sendgrid_event(run: str, i: int) -> dict:
    return {
        "email": f"subscriber{i % 50_000}@example.com",
        "timestamp": 1763700000 + i % 86400,
        "smtp-id": f"<{run}.{i}@ismtpd0001p1iad2.sendgrid.net>",
        "event": ("processed", "delivered", "open", "click", "deferred", "bounce")[i % 6],
        "category": ["newsletter"],
        "sg_event_id": f"{run}-{i:08d}-ZGVsaXZlcmVkLTAtMjQ",
        "sg_message_id": f"{run}{i}.filterdrecv-p3las1-5bf99c48d5-2x8tq-18-5F5FC76C-9.0",
        "response": "250 OK",
        "useragent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64)",
        "ip": "203.0.113.7",
        "mail_kind": "newsletter",
        "mail_id": "42",
        "row_id": str(i),
        "subscriber_id": str(i % 50_000 + 1),
    }


def build_batches(n_batches: int, run: str, seed: int = 7) -> tuple[list[list[dict]], set[str]]:
    """Batches of BATCH events; 30% of each is a redelivery of an event from an earlier batch."""
    rng = random.Random(seed)
    batches, sent, unique = [], [], set()
    n_new = int(BATCH * (1 - DUPLICATE_SHARE))
    counter = 0
    for _b in range(n_batches):
        fresh = [sendgrid_event(run, counter + j) for j in range(n_new if sent else BATCH)]
        counter += len(fresh)
        dups = [rng.choice(sent) for _ in range(BATCH - len(fresh))] if sent else []
        batch = fresh + dups
        rng.shuffle(batch)
        sent += fresh
        unique.update(e["sg_event_id"] for e in fresh)
        batches.append(batch)
    return batches, unique


def signed_requests(batches, private_key) -> list[bytes]:
    ts = str(int(time.time()))
    out = []
    for batch in batches:
        body = orjson.dumps(batch)
        sig = base64.b64encode(private_key.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))).decode()
        out.append(
            build_request(
                "POST",
                "/webhooks/sendgrid",
                body,
                {
                    "Content-Type": "application/json",
                    "X-Twilio-Email-Event-Webhook-Signature": sig,
                    "X-Twilio-Email-Event-Webhook-Timestamp": ts,
                },
            )
        )
    return out


def measure(app: str, n_batches: int, posters: int, env: dict, private_key, label: str) -> dict:
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE webhook_events RESTART IDENTITY")
    run = f"{label[:5]}{int(time.time())}"
    batches, unique = build_batches(n_batches, run)
    requests = signed_requests(batches, private_key)
    port = free_port()
    proc = start_server(app, port, env)
    try:
        res = asyncio.run(
            run_load(port, lambda i: requests[i], posters, 600, keep_bodies=True, max_requests=len(requests))
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    answers = [orjson.loads(b) for b in res.bodies]
    stored_ids = {r[0] for r in db.query("SELECT sg_event_id FROM webhook_events")}
    ((rows, distinct),) = db.query("SELECT count(*), count(DISTINCT sg_event_id) FROM webhook_events")
    total = sum(len(b) for b in batches)
    return {
        "label": label,
        "events": total,
        "unique": len(unique),
        "elapsed": res.elapsed,
        "rate": total / res.elapsed,
        "p99_ms": res.pct(0.99),
        "all_200": res.statuses == {200: len(requests)},
        "lost": len(unique - stored_ids),
        "unexpected": len(stored_ids - unique),
        "duplicated": rows - distinct,
        "answers_stored": sum(a.get("stored", 0) for a in answers),
        "answers_duplicates": sum(a.get("duplicates", 0) for a in answers),
    }


def show(r: dict) -> None:
    ok = (
        r["all_200"]
        and r["lost"] == 0
        and r["duplicated"] == 0
        and r["unexpected"] == 0
        and r["answers_stored"] == r["unique"]
        and r["answers_stored"] + r["answers_duplicates"] == r["events"]
    )
    print(
        f"  {r['label']:<36} {r['rate']:>9,.0f} events/s  ({r['events']:,} events, {r['unique']:,} unique, "
        f"{r['elapsed']:.2f} s, batch p99 {r['p99_ms']:.0f} ms)"
    )
    print(
        f"  {'':<36} lost {r['lost']}, duplicated {r['duplicated']}, unexpected {r['unexpected']}; answers: "
        f"stored {r['answers_stored']:,} + duplicates {r['answers_duplicates']:,}; all 200: {r['all_200']} "
        f"→ {'OK' if ok else 'MISMATCH'}"
    )
    r["ok"] = ok


def record_results(fast: dict, naive: dict, args, met: bool) -> None:
    """The figures for BENCHMARKS.md (scripts/bench/report.py)."""
    bench = f"SendGrid webhook ingest, {BATCH}-event signed batches, {DUPLICATE_SHARE:.0%} redeliveries"
    label = "naive (transaction per request, INSERT per event)"
    details = {
        "posters": args.posters,
        "batches": args.batches,
        "baseline_batches": args.baseline_batches,
        "events": fast["events"],
        "unique": fast["unique"],
        "lost": fast["lost"],
        "duplicated": fast["duplicated"],
        "answers_add_up": fast["ok"],
        "baseline_answers_add_up": naive["ok"],
    }
    record(
        bench,
        "events/s",
        fast["rate"],
        "events/s",
        baseline=naive["rate"],
        baseline_label=label,
        target=">= 10,000 events/s on 2 cores, poster included; 0 lost, 0 duplicated",
        met=met,
        **details,
    )
    record(
        bench,
        "p99 latency per batch",
        fast["p99_ms"],
        "ms",
        baseline=naive["p99_ms"],
        baseline_label=label,
        higher_is_better=False,
        **details,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--baseline-batches", type=int, default=100)
    parser.add_argument("--posters", type=int, default=8)
    args = parser.parse_args()
    config.reload()
    migrate.migrate(BENCH_DB)
    db.init(BENCH_DB)
    import redis

    redis.Redis.from_url(BENCH_REDIS).flushdb()
    private_key = ec.generate_private_key(ec.SECP256R1())
    public = base64.b64encode(
        private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    ).decode()
    env = {
        **os.environ,
        "DATABASE_URL": BENCH_DB,
        "REDIS_URL": BENCH_REDIS,
        "SENDGRID_WEBHOOK_PUBLIC_KEY": public,
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    print(
        f"webhook benchmark: batches of {BATCH} signed events, {DUPLICATE_SHARE:.0%} redeliveries, "
        f"{args.posters} concurrent posters, {os.cpu_count()} cores shared by server, Postgres and poster"
    )
    results = [measure("app.web:app", args.batches, args.posters, env, private_key, "webhook (group commit)")]
    show(results[-1])
    results.append(
        measure(
            "scripts.bench.naive_webhook_app:naive_app",
            args.baseline_batches,
            args.posters,
            {**env, "DB_POOL_SIZE": "64"},
            private_key,
            "naive: txn per request, row INSERTs",
        )
    )
    show(results[-1])
    redis.Redis.from_url(BENCH_REDIS).flushdb()
    fast, naive = results
    met = fast["rate"] >= 10_000 and fast["ok"]
    print(
        f"  speed-up over naive: {fast['rate'] / naive['rate']:.1f}x;  target >= 10,000 events/s with 0 lost "
        f"and 0 duplicated: {'MET' if met else 'NOT MET'}"
    )
    record_results(fast, naive, args, met)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
