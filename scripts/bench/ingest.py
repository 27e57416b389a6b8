"""Ingestion benchmark: events/s through the HTTP API in batches of 500, and single-event p50/p99
latency at 32 concurrent keep-alive connections, for the real service and a naive baseline
(scripts/bench/naive_ingest_app.py) measured in the same run. Loopback only; bounded in time.

    .venv/bin/python scripts/bench/ingest.py [--seconds 10] [--web-workers 1]

Targets (2 cores): >= 20,000 events/s batched; p99 <= 20 ms single.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.platform import apikeys, config, db, migrate  # noqa: E402
from scripts.bench.loadgen import build_request, free_port, run_load, start_server  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

BENCH = "event ingest over HTTP"
NAIVE = "naive (threadpool, INSERT per event)"


def event(run: str, i: int) -> dict:
    return {
        "id": f"{run}-{i}",
        "user_id": f"user-{i % 5000}",
        "category": ("likes", "comments")[i % 2],
        "entity_type": "post",
        "entity_id": f"post-{i % 97}",
        "actor_id": f"a{i % 31}",
        "actor_name": f"Actor {i % 31}",
        "payload": {"title": "A post title", "n": i},
        "occurred_at": "2026-11-21T09:30:00Z",
    }


def measure(port: int, key: str, seconds: float, label: str) -> dict:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    run = uuid.uuid4().hex[:8]

    def batch(i):
        body = orjson.dumps({"events": [event(f"{run}-b{i}", j) for j in range(500)]})
        return build_request("POST", "/v1/events", body, headers)

    # Pre-build the batches so the client spends its CPU on sending, not on JSON.
    prebuilt = [batch(i) for i in range(int(seconds * 100))]
    batched = asyncio.run(run_load(port, lambda i: prebuilt[i], 4, seconds, max_requests=len(prebuilt)))
    single_reqs = [
        build_request("POST", "/v1/events", orjson.dumps(event(f"{run}-s", i)), headers) for i in range(200_000)
    ]
    asyncio.run(run_load(port, lambda i: single_reqs[-1 - i], 32, 1.0))  # warm-up
    single = asyncio.run(run_load(port, lambda i: single_reqs[i], 32, seconds, max_requests=len(single_reqs) - 5000))
    ok = batched.statuses.get(202, 0) == batched.count and single.statuses.get(202, 0) == single.count
    out = {
        "label": label,
        "batched_events_per_s": batched.count * 500 / batched.elapsed,
        "batched_p99_ms": batched.pct(0.99),
        "single_req_per_s": single.rate,
        "single_p50_ms": single.pct(0.50),
        "single_p99_ms": single.pct(0.99),
        "all_202": ok,
        "statuses": {**batched.statuses, **{f"single {k}": v for k, v in single.statuses.items()}},
    }
    return out


def record_results(real: dict, naive: dict, args) -> None:
    """The figures for BENCHMARKS.md (scripts/bench/report.py)."""
    details = {
        "seconds": args.seconds,
        "web_workers": args.web_workers,
        "all_202": real["all_202"],
        "baseline_all_202": naive["all_202"],
    }
    record(
        BENCH,
        "events/s, batches of 500 (4 connections)",
        real["batched_events_per_s"],
        "events/s",
        baseline=naive["batched_events_per_s"],
        baseline_label=NAIVE,
        target=">= 20,000 events/s on 2 cores",
        met=real["batched_events_per_s"] >= 20000 and real["all_202"],
        **details,
    )
    record(
        BENCH,
        "requests/s, single event (32 connections)",
        real["single_req_per_s"],
        "requests/s",
        baseline=naive["single_req_per_s"],
        baseline_label=NAIVE,
        **details,
    )
    record(
        BENCH,
        "p50 latency, single event (32 connections)",
        real["single_p50_ms"],
        "ms",
        baseline=naive["single_p50_ms"],
        baseline_label=NAIVE,
        higher_is_better=False,
        **details,
    )
    record(
        BENCH,
        "p99 latency, single event (32 connections)",
        real["single_p99_ms"],
        "ms",
        baseline=naive["single_p99_ms"],
        baseline_label=NAIVE,
        target="<= 20 ms on 2 cores",
        met=real["single_p99_ms"] <= 20 and real["all_202"],
        higher_is_better=False,
        **details,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each phase")
    parser.add_argument("--web-workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://localhost/notify_bench")
    )
    args = parser.parse_args()

    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("APP_ENV", "development")
    config.reload()
    migrate.migrate(args.database_url)
    db.init(args.database_url)
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE digest_events")
    key = apikeys.create(f"bench-{uuid.uuid4().hex[:6]}", "events")
    env = {**os.environ, "DATABASE_URL": args.database_url, "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}

    results = []
    for label, app, workers in (
        ("notify (async + group commit)", "app.web:app", args.web_workers),
        (NAIVE, "scripts.bench.naive_ingest_app:app", 1),
    ):
        port = free_port()
        proc = start_server(app, port, env, workers=workers, app_dir=str(ROOT))
        try:
            results.append(measure(port, key, args.seconds, label))
        finally:
            proc.terminate()
            proc.wait(15)
    stored = db.query("SELECT count(*) FROM digest_events")[0][0]

    print(
        f"\ningest benchmark: {os.cpu_count()} cores, {args.seconds:.0f} s per phase, "
        f"web workers {args.web_workers}, client in the same machine"
    )
    print(f"{'':40} {'batched ev/s':>13} {'single req/s':>13} {'p50 ms':>8} {'p99 ms':>8}  all 202")
    for r in results:
        print(
            f"{r['label']:40} {r['batched_events_per_s']:>13,.0f} {r['single_req_per_s']:>13,.0f} "
            f"{r['single_p50_ms']:>8.2f} {r['single_p99_ms']:>8.2f}  {r['all_202']}"
        )
    real, naive = results
    print(
        f"speed-up vs naive: batched x{real['batched_events_per_s'] / naive['batched_events_per_s']:.1f}, "
        f"single x{real['single_req_per_s'] / naive['single_req_per_s']:.1f}"
    )
    print(
        f"targets: batched >= 20,000 ev/s -> {'met' if real['batched_events_per_s'] >= 20000 else 'NOT met'}; "
        f"single p99 <= 20 ms -> {'met' if real['single_p99_ms'] <= 20 else 'NOT met'}"
    )
    print(f"rows stored: {stored:,}")
    record_results(real, naive, args)
    return 0 if real["all_202"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
