"""The shared send-rate limiter (app/newsletter/ratelimit.py) against dramatiq.rate_limits, the
library a user would reach for, both on the same real Redis.

    .venv/bin/python scripts/bench/ratelimit.py [--redis-url redis://127.0.0.1:6379/12]

The unit that matters is a recipient: a send batch of 100 must take 100 tokens before its one
provider call. Ours takes them in one Lua call; dramatiq's BucketRateLimiter admits one unit per
acquire(), so a batch costs 100 Redis round trips (counting batches instead would let a rate of
"10/s" mean 10 or 10,000 recipients). Reported: Redis round trips and microseconds per admitted
recipient with an unlimited-enough bucket, so only the limiter's own cost is measured. The
adaptive part (a 429 halves the rate everywhere, recovery on success) has no counterpart there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import redis  # noqa: E402
from dramatiq.rate_limits import BucketRateLimiter  # noqa: E402
from dramatiq.rate_limits.backends import RedisBackend  # noqa: E402

from app.newsletter.ratelimit import AdaptiveRateLimiter  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

BATCH = 100
BATCHES = 300


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    args = p.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()

    ours = AdaptiveRateLimiter("bench", client=client, ceiling=10_000_000)
    started = time.perf_counter()
    for _ in range(BATCHES):
        granted, _ = ours.reserve(BATCH)
        assert granted
    ours_us = (time.perf_counter() - started) / (BATCHES * BATCH) * 1e6

    theirs = BucketRateLimiter(RedisBackend(client=client), "bench", limit=10_000_000, bucket=1000)
    started = time.perf_counter()
    for _ in range(BATCHES):
        for _ in range(BATCH):
            with theirs.acquire(raise_on_failure=True):
                pass
    theirs_us = (time.perf_counter() - started) / (BATCHES * BATCH) * 1e6
    client.flushdb()

    print(f"{BATCHES} batches of {BATCH} recipients on one Redis")
    print(f"  ours (AdaptiveRateLimiter.reserve(n)):  {1 / BATCH:>5.2f} round trips, {ours_us:>6.2f} µs per recipient")
    print(f"  dramatiq BucketRateLimiter.acquire():   {1:>5.2f} round trips, {theirs_us:>6.2f} µs per recipient")
    print(f"  ratio: {theirs_us / ours_us:.0f}x less limiter time per recipient with ours")
    record(
        "send-rate limiter on one Redis",
        "limiter time per recipient",
        ours_us,
        "µs",
        baseline=theirs_us,
        baseline_label="dramatiq BucketRateLimiter.acquire() per recipient",
        higher_is_better=False,
        batch=BATCH,
        batches=BATCHES,
        round_trips_per_recipient=1 / BATCH,
        baseline_round_trips_per_recipient=1,
    )


if __name__ == "__main__":
    main()
