"""How a digest records what it handled (issue 26.2): database time per digest of 20 events, for the
three designs the issue names, measured in one run on one database:

  rewrite   the design before: every handled event row gets digest_run_id (one non-HOT update per
            event: a new row version and new entries in every index); unhandled events are found
            through the partial index WHERE digest_run_id IS NULL, which marking shrinks
  narrow    marks kept in their own narrow table (event_id PRIMARY KEY, run_id): one small insert
            per event; unhandled events are the subscriber's events with no mark row (an anti-join
            over all of their events within retention: nothing shrinks)
  snapshot  what ships (digest/marks.py): the snapshot the events were read as of becomes the
            subscriber's mark, one narrow row updated in place per digest; unhandled events are
            those the mark does not show, found by txid range (digest_events_pending_idx)

    .venv/bin/python scripts/bench/digest_mark.py [--subscribers 300] [--history 200] [--rounds 20]

Each design has its own subscribers (--subscribers each, with --history events already handled the
design's way, so indexes and anti-joins meet a realistic past). A round inserts 20 new events for
every subscriber of each design, then per design, for batches of 100 subscribers like the worker's:
read the unhandled events (read), then record them as handled and commit (mark). Rounds alternate
between the designs so machine noise hits them alike. Figures: µs per digest, median over rounds.
Its own database (notify_bench_mark), created and dropped here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

from app.platform import config  # noqa: E402
from app.platform.db import pg_array  # noqa: E402
from digest import load, marks, runs  # noqa: E402
from scripts.bench import event_insert  # noqa: E402  (its scratch-database helpers)
from scripts.bench.shared import record  # noqa: E402

config.reload()
NAME = "notify_bench_mark"
BATCH = 100
EVENTS = 20
DESIGNS = ("rewrite", "narrow", "snapshot")

# The read before 0690 (digest/load.py as it was): the partial index shrinks as events are marked.
REWRITE_READ = f"""
SELECT s.id, {load._COLUMNS}
FROM subscribers s CROSS JOIN LATERAL (
    SELECT {load._COLUMNS} FROM digest_events e
    WHERE e.user_id = s.user_id AND e.digest_run_id IS NULL AND NOT (e.category = ANY (s.category_opt_outs))
    ORDER BY e.id LIMIT 1000) e
WHERE s.id = ANY (%s::bigint[]) ORDER BY s.id, e.id
"""
NARROW_READ = f"""
SELECT s.id, {load._COLUMNS}
FROM subscribers s CROSS JOIN LATERAL (
    SELECT {load._COLUMNS} FROM digest_events e
    WHERE e.user_id = s.user_id AND NOT (e.category = ANY (s.category_opt_outs))
      AND NOT EXISTS (SELECT 1 FROM bench_event_marks k WHERE k.event_id = e.id)
    ORDER BY e.id LIMIT 1000) e
WHERE s.id = ANY (%s::bigint[]) ORDER BY s.id, e.id
"""
NARROW_MARK = """
INSERT INTO bench_event_marks (event_id, run_id)
SELECT * FROM unnest(%s::bigint[], %s::bigint[]) ON CONFLICT DO NOTHING
"""
INSERT_EVENTS = """
INSERT INTO digest_events
    (source, producer_id, user_id, category, entity_type, entity_id, actor_id, actor_name, payload)
SELECT 'bench', %(design)s || %(tag)s || '-' || u || '-' || i, 'm-' || %(design)s || '-' || u, 'likes', 'post',
       'p' || (i %% 7), 'a' || i, 'Actor', '{"title": "A post"}'
FROM generate_series(0, %(users)s - 1) u, generate_series(1, %(n)s) i
"""


def fresh() -> str:
    return event_insert.fresh(NAME, None)


def drop() -> None:
    event_insert.drop(NAME)


def read(cur, design: str, sids: list[int]) -> tuple[dict[int, list[int]], dict]:
    """({subscriber: [event id, ...]}, covers) of the unhandled events."""
    if design == "snapshot":
        loaded = load.load(cur, sids)
        return {sid: [e.id for e in evs] for sid, evs in loaded.events.items()}, loaded.covers
    cur.execute(REWRITE_READ if design == "rewrite" else NARROW_READ, (pg_array(sids),))
    out: dict[int, list[int]] = {sid: [] for sid in sids}
    for row in cur.fetchall():
        out[row[0]].append(row[1])
    return out, {}


def mark(cur, design: str, run_of: dict[int, int], events: dict[int, list[int]], covers: dict) -> None:
    handled = [(run_of[sid], ids) for sid, ids in events.items()]
    if design == "rewrite":
        runs.mark_events(cur, handled)
    elif design == "narrow":
        pairs = sorted((eid, rid) for rid, ids in handled for eid in ids)
        cur.execute(NARROW_MARK, (pg_array([p[0] for p in pairs]), pg_array([p[1] for p in pairs])))
    else:
        marks.advance(cur, [(sid, covers[sid]) for sid in events])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=300, help="per design")
    p.add_argument("--history", type=int, default=200, help="handled events per subscriber before the rounds")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    conn = psycopg2.connect(fresh())
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE bench_event_marks (event_id bigint PRIMARY KEY, run_id bigint NOT NULL)")
            # The rewrite design's index (dropped by 0693): its read walks it in id order.
            cur.execute("CREATE INDEX bench_unsent_idx ON digest_events (user_id, id) WHERE digest_run_id IS NULL")
            sids: dict[str, list[int]] = {}
            for design in DESIGNS:
                cur.execute(
                    "INSERT INTO subscribers (user_id, email, canonical_email, name) "
                    "SELECT 'm-' || %s || '-' || u, u || '@' || %s || '.test', u || '@' || %s || '.test', 'N' "
                    "FROM generate_series(0, %s - 1) u ORDER BY u RETURNING id",
                    (design, design, design, args.subscribers),
                )
                sids[design] = [r[0] for r in cur.fetchall()]
            # One run id per subscriber stands for its runs: the designs' marks need a number.
            run_of = {sid: sid for ids in sids.values() for sid in ids}
            conn.commit()
            for design in DESIGNS:  # the past, handled the design's way, in digests of 20
                for start in range(0, args.history, EVENTS):
                    cur.execute(
                        INSERT_EVENTS,
                        {"tag": f"h{start}", "design": design, "users": args.subscribers, "n": EVENTS},
                    )
                    conn.commit()
                    for b in range(0, len(sids[design]), BATCH):
                        batch = sids[design][b : b + BATCH]
                        events, covers = read(cur, design, batch)
                        mark(cur, design, run_of, events, covers)
                        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        conn.autocommit = False
        times = {d: {"read": [], "mark": []} for d in DESIGNS}
        with conn.cursor() as cur:
            for r in range(args.rounds):
                for design in DESIGNS:
                    cur.execute(
                        INSERT_EVENTS, {"tag": f"r{r}", "design": design, "users": args.subscribers, "n": EVENTS}
                    )
                conn.commit()
                order = DESIGNS[r % 3 :] + DESIGNS[: r % 3]
                for design in order:
                    read_s = mark_s = 0.0
                    for b in range(0, len(sids[design]), BATCH):
                        batch = sids[design][b : b + BATCH]
                        t0 = time.perf_counter()
                        events, covers = read(cur, design, batch)
                        conn.commit()
                        t1 = time.perf_counter()
                        mark(cur, design, run_of, events, covers)
                        conn.commit()
                        t2 = time.perf_counter()
                        read_s += t1 - t0
                        mark_s += t2 - t1
                        got = sum(len(v) for v in events.values())
                        assert got == len(batch) * EVENTS, (design, got)
                    times[design]["read"].append(read_s * 1e6 / len(sids[design]))
                    times[design]["mark"].append(mark_s * 1e6 / len(sids[design]))
    finally:
        conn.close()
        drop()
    print(
        f"µs per digest of {EVENTS} events, {args.subscribers} subscribers per design with {args.history} "
        f"handled events each, batches of {BATCH}, median of {args.rounds} rounds"
    )
    print(f"{'design':<10} {'read':>8} {'mark':>8} {'total':>8}")
    med = {}
    for design in DESIGNS:
        rd, mk = statistics.median(times[design]["read"]), statistics.median(times[design]["mark"])
        med[design] = (rd, mk)
        print(f"{design:<10} {rd:>8.1f} {mk:>8.1f} {rd + mk:>8.1f}")
    base = med["rewrite"]
    for design in ("snapshot", "narrow"):
        rd, mk = med[design]
        record(
            "digest marking",
            f"database time per digest of {EVENTS} events, read + mark ({design})",
            rd + mk,
            "µs",
            baseline=sum(base),
            baseline_label="rewrite each event row (the design before)",
            higher_is_better=False,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
