"""The feed's Server-Sent Events stream (issue 24): what N open streams cost a web process and
Postgres while nothing happens, and how soon a new event reaches every one of them; beside the
naive way a front end would get the same news — polling GET /v1/feed at the same interval —
measured in the same run.

    .venv/bin/python scripts/bench/feed_stream.py [--streams 200] [--events 200] [--seconds 10]

One uvicorn web process (FEED_STREAM_POLL_SECONDS=--poll). --streams subscribers, each with
--events events over 20 posts, each with one open stream (its own feed token). Figures:
  idle CPU     web process CPU + Postgres statement time in this database (pg_stat_database
               active_time: other databases on a shared machine left out), % of one core
  delivery     from one INSERT of an event for every subscriber to each stream's message: p50, p99
Baseline: the same clients polling GET /v1/feed?limit=20 every --poll seconds (idle CPU only; its
delivery is the same poll interval). Its own database (notify_bench_feed_stream).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# This folder's click.py would shadow the click package httpx imports.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
os.environ.setdefault("APP_ENV", "development")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--events", type=int, default=200, help="events per subscriber")
    p.add_argument("--seconds", type=float, default=10.0, help="idle window measured")
    p.add_argument("--poll", type=float, default=2.0, help="FEED_STREAM_POLL_SECONDS, and the baseline's interval")
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_feed_stream")
    return p.parse_args()


ARGS = parse_args()
os.environ["DATABASE_URL"] = ARGS.database_url

import httpx  # noqa: E402
import psycopg2  # noqa: E402

from app.platform import config, db, migrate, tokens  # noqa: E402
from scripts.bench import shared  # noqa: E402

config.reload()
BASE = f"http://127.0.0.1:{ARGS.port}"


def seed(n: int, events: int) -> list[tuple[int, str]]:
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE subscribers, digest_events, feed_state, feed_state_all RESTART IDENTITY CASCADE")
        cur.execute(
            "INSERT INTO subscribers (user_id, email, name) "
            "SELECT 'fs-' || g, 'fs-' || g || '@example.test', 'Stream ' || g FROM generate_series(1, %s) g",
            (n,),
        )
        cur.execute(
            """
            INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id,
                                       actor_id, actor_name, payload, occurred_at)
            SELECT 'bench', s || '-' || g, 'fs-' || s, 'like', 'post', 'p' || (g %% 20), 'a' || (g %% 9),
                   'Actor ' || (g %% 9), '{"entity_title": "A post"}', now() - make_interval(secs => g * 60)
            FROM generate_series(1, %s) s, generate_series(1, %s) g
            """,
            (n, events),
        )
        cur.execute("SELECT id, user_id, token_version FROM subscribers ORDER BY id")
        rows = cur.fetchall()
    db.query("VACUUM ANALYZE digest_events")
    expires = int(time.time()) + 3600
    return [(sid, tokens.feed_token(sid, version, expires)) for sid, _, version in rows]


def start_web() -> subprocess.Popen:
    env = {
        **os.environ,
        "APP_ENV": "development",
        "DATABASE_URL": ARGS.database_url,
        "FEED_STREAM_POLL_SECONDS": str(ARGS.poll),
        "FEED_STREAM_MAX_CONNECTIONS": str(ARGS.streams + 10),
        "DB_POOL_SIZE": "20",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.web:app", "--port", str(ARGS.port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{BASE}/healthz", timeout=1).status_code in (200, 503):
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the web process did not start")


def active_ms(pg) -> float:
    """Time this database's backends spent running statements so far (pg_stat_database): unlike
    the server's CPU, it leaves out every other database on a shared machine."""
    with pg.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT active_time FROM pg_stat_database WHERE datname = current_database()")
        return float(cur.fetchone()[0])


def idle_cpu(web: subprocess.Popen, pg, seconds: float) -> tuple[float, float]:
    """(web process CPU, Postgres statement time for this database), % of one core over `seconds`."""
    before, pg_before = shared.group_cpu(web.pid), active_ms(pg)
    window = seconds + 1.5  # backends report their statistics at most once a second
    time.sleep(window)
    web_s = shared.cpu_delta(before, shared.group_cpu(web.pid))
    return web_s / window * 100, (active_ms(pg) - pg_before) / 1e3 / window * 100


async def open_streams(client: httpx.AsyncClient, subs, ready: list, got: dict):
    async def one(sid, token):
        async with client.stream("GET", "/v1/feed/stream", headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status_code == 200, r.status_code
            messages = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    messages += 1
                    if messages == 1:
                        ready.append(sid)
                    else:
                        got.setdefault(sid, time.monotonic())

    return [asyncio.create_task(one(sid, token)) for sid, token in subs]


async def streams_phase(web, pg, subs) -> dict:
    ready, got = [], {}
    limits = httpx.Limits(max_connections=len(subs) + 10, max_keepalive_connections=len(subs) + 10)
    async with httpx.AsyncClient(base_url=BASE, timeout=httpx.Timeout(60.0), limits=limits) as client:
        tasks = await open_streams(client, subs, ready, got)
        while len(ready) < len(subs):
            await asyncio.sleep(0.1)
        await asyncio.sleep(ARGS.poll * 2)  # settled
        web_pct, pg_pct = await asyncio.to_thread(idle_cpu, web, pg, ARGS.seconds)
        sent = time.monotonic()
        db.query(
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id) "
            "SELECT 'bench', 'new-' || id, user_id, 'comment', 'post', 'fresh', 'zed' FROM subscribers"
        )
        deadline = time.monotonic() + ARGS.poll * 10 + 30
        while len(got) < len(subs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delays = sorted((t - sent) * 1e3 for t in got.values())
    return {
        "web_pct": web_pct,
        "pg_pct": pg_pct,
        "delivered": len(delays),
        "p50_ms": statistics.median(delays) if delays else float("nan"),
        "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))] if delays else float("nan"),
    }


async def polling_phase(web, pg, subs) -> dict:
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=len(subs) + 10, max_keepalive_connections=len(subs) + 10)
    async with httpx.AsyncClient(base_url=BASE, timeout=httpx.Timeout(60.0), limits=limits) as client:

        async def poller(i, token):
            await asyncio.sleep(ARGS.poll * i / len(subs))  # spread, as real clients are
            while not stop.is_set():
                r = await client.get("/v1/feed?limit=20", headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 200
                await asyncio.sleep(ARGS.poll)

        tasks = [asyncio.create_task(poller(i, token)) for i, (_, token) in enumerate(subs)]
        await asyncio.sleep(ARGS.poll * 2)
        web_pct, pg_pct = await asyncio.to_thread(idle_cpu, web, pg, ARGS.seconds)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"web_pct": web_pct, "pg_pct": pg_pct}


def main() -> None:
    migrate.migrate(ARGS.database_url)
    db.init(ARGS.database_url)
    subs = seed(ARGS.streams, ARGS.events)
    web = start_web()
    pg_conn = psycopg2.connect(ARGS.database_url)
    pg_conn.autocommit = True
    pg = pg_conn
    try:
        ours = asyncio.run(streams_phase(web, pg, subs))
        naive = asyncio.run(polling_phase(web, pg, subs))
    finally:
        shared.stop_group(web)
        pg_conn.close()
    n = ARGS.streams
    print(f"{n} open streams, {ARGS.events} events each, poll {ARGS.poll:g} s, idle {ARGS.seconds:g} s")
    print(f"streams: web {ours['web_pct']:.1f} % + postgres {ours['pg_pct']:.1f} % of a core")
    print(f"polling GET /v1/feed: web {naive['web_pct']:.1f} % + postgres {naive['pg_pct']:.1f} % of a core")
    delivered = f"{ours['delivered']}/{n}"
    print(f"one new event to {delivered} streams: p50 {ours['p50_ms']:.0f} ms, p99 {ours['p99_ms']:.0f} ms")
    ours_cpu, naive_cpu = ours["web_pct"] + ours["pg_pct"], naive["web_pct"] + naive["pg_pct"]
    shared.record(
        "in-app feed stream (SSE)",
        f"idle CPU with {n} open streams (web + Postgres), poll {ARGS.poll:g} s",
        ours_cpu,
        "% of a core",
        baseline=naive_cpu,
        baseline_label=f"{n} clients polling GET /v1/feed every {ARGS.poll:g} s",
        higher_is_better=False,
        web=ours["web_pct"],
        postgres=ours["pg_pct"],
    )
    shared.record(
        "in-app feed stream (SSE)",
        f"a new event to all {n} streams, p99",
        ours["p99_ms"],
        "ms",
        target=f"<= poll interval ({ARGS.poll * 1e3:g} ms) + the feed's own time",
        met=ours["delivered"] == n,
        higher_is_better=False,
        p50=ours["p50_ms"],
        delivered=ours["delivered"],
    )


if __name__ == "__main__":
    main()
