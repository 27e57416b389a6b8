"""Issue 24, item 7: the digest build with seen/read state present, beside the same build without
any, measured in the same run, batch for batch.

    .venv/bin/python scripts/bench/digest_seen.py [--subscribers 4000] [--percent 10] [--rounds 5]

Half the subscribers (the odd ids) have `--percent` of their posts seen in the app (digest/seen.py),
built by the worker's code as it is; the other half have no state and are built as before issue 24
(the seen-state statement left out: digest/seen.py `load` stubbed to find nothing, which is the
old code path). Batches of DIGEST_CLAIM_BATCH runs of each half alternate, through
the worker's own build step (digest/build.py build_digests: load the unsent events, load the seen
state, group, rank, read titles and links, render HTML and text; link tracking off, nothing
written), taking turns at going first, so both halves see the same machine at the same moments.
Figure = µs per digest built: each batch's fastest time over the rounds, summed (a shared machine's
noise only ever adds). Target: within 5 % of the
half without state. Its own database (notify_bench_digest_seen).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=4000)
    p.add_argument("--events", type=int, default=20, help="events per subscriber (over 6 posts)")
    p.add_argument("--percent", type=int, default=10, help="share of the posts seen, for half the subscribers")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_digest_seen")
    return p.parse_args()


ARGS = parse_args()
os.environ["DATABASE_URL"] = ARGS.database_url
os.environ["TRACKING"] = "0"

from app.platform import config, db, migrate  # noqa: E402
from digest import seen as digest_seen  # noqa: E402
from digest.build import build_digests  # noqa: E402
from digest.claim import ClaimedRun  # noqa: E402
from scripts.bench import shared  # noqa: E402

config.reload()


def runs_of(rows) -> list[ClaimedRun]:
    return [
        ClaimedRun(i, "daily", 0, sid, user_id, email, name, "daily", 1, False, None)
        for i, (sid, user_id, email, name) in enumerate(rows, 1)
    ]


REAL_LOAD = digest_seen.load


def before_issue_24(cur, subscriber_ids):
    return {}


def build_seconds(batches: list[list[ClaimedRun]], with_seen_step: bool = True) -> float:
    digest_seen.load = REAL_LOAD if with_seen_step else before_issue_24
    settings = config.get()
    conn = db.thread_connection.get()
    took = 0.0
    for batch in batches:
        started = time.perf_counter()
        with db.transaction(conn) as cur:
            ready, errors = build_digests(cur, batch, settings)
        took += time.perf_counter() - started
        assert not errors and ready
    return took


def main() -> None:
    migrate.migrate(ARGS.database_url)
    db.init(ARGS.database_url)
    now = datetime.now(UTC)
    shared.seed_digest_data(ARGS.subscribers, ARGS.events, now)
    rows = db.query("SELECT id, user_id, email, name FROM subscribers ORDER BY id")
    with_state = [r[0] for r in rows if r[0] % 2]
    with db.raw_cursor() as cur:
        shared.seed_seen(cur, ARGS.percent, now, with_state)
    db.query("ANALYZE feed_state")
    (seen_pairs,) = db.query("SELECT count(*) FROM feed_state")[0]
    size = config.get().digest_claim_batch
    plain = runs_of([r for r in rows if not r[0] % 2])
    seen = runs_of([r for r in rows if r[0] % 2])
    chunks = lambda runs: [runs[i : i + size] for i in range(0, len(runs), size)]  # noqa: E731
    plain_batches, seen_batches = chunks(plain), chunks(seen)
    build_seconds(plain_batches[:2] + seen_batches[:2])  # warm: templates, caches, plans
    # Each batch's fastest time over the rounds (noise only ever adds), the two halves alternating
    # batch for batch and taking turns at going first.
    fastest = {"none": [float("inf")] * len(plain_batches), "seen": [float("inf")] * len(seen_batches)}
    for round_no in range(ARGS.rounds):
        for i, (a, b) in enumerate(zip(plain_batches, seen_batches)):
            order = [("none", a), ("seen", b)] if (round_no + i) % 2 == 0 else [("seen", b), ("none", a)]
            for kind, batch in order:
                took = build_seconds([batch], with_seen_step=kind == "seen")
                fastest[kind][i] = min(fastest[kind][i], took)
    best = {k: sum(fastest[k]) / len(plain if k == "none" else seen) * 1e6 for k in fastest}
    ratio = best["seen"] / best["none"]
    print(f"{len(rows)} subscribers x {ARGS.events} events; {seen_pairs} (subscriber, post) pairs seen")
    print(f"build, µs per digest: no state {best['none']:.0f}, {ARGS.percent}% seen {best['seen']:.0f} ({ratio:.3f}x)")
    shared.record(
        "digest build with seen state",
        f"µs per digest built, {ARGS.percent} % of posts seen",
        best["seen"],
        "µs",
        baseline=best["none"],
        baseline_label="the build before issue 24, no state (same run, alternating batches)",
        target="within 5 % of the build without state",
        met=ratio <= 1.05,
        higher_is_better=False,
        subscribers=len(rows),
        rounds=ARGS.rounds,
    )


if __name__ == "__main__":
    main()
