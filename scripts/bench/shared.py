"""Helpers shared by the benchmarks (newsletter.py, peer_postoffice.py, digest.py, profile_digest.py):
the ~1 KB newsletter body, seeding the subscribers (and their digest events), Dramatiq worker process
groups, and CPU accounting from /proc (worker processes, the Postgres server's processes, single
processes such as the sink).

Nothing here imports app/ at module level: the benchmarks set DATABASE_URL and friends first.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
RESULTS_ENV = "BENCH_RESULTS"  # scripts/bench/report.py sets it: every figure also goes there as one JSON line
ROOT = Path(__file__).resolve().parents[2]


def procfile_command(name: str, env: dict) -> list[str]:
    """The Procfile's `name` command with its ${VAR:-default}s expanded from `env`, its program run by
    this interpreter (`python -m dramatiq` / `-m uvicorn`): a benchmark measures the processes as the
    Procfile starts them."""
    line = next(ln for ln in (ROOT / "Procfile").read_text().splitlines() if ln.startswith(f"{name}:"))
    command = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), line.split(":", 1)[1])
    argv = shlex.split(command)
    assert argv[0] in ("dramatiq", "uvicorn"), argv
    return [sys.executable, "-m", argv[0], *argv[1:]]


def read_records(path) -> list[dict]:
    """The figures record() wrote to `path` (one JSON line each); [] when none were."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record(
    bench: str,
    figure: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_label: str = "",
    target: str = "",
    met: bool | None = None,
    higher_is_better: bool = True,
    **details,
) -> None:
    """One figure for the report (BENCHMARKS.md): what, how much, beside which baseline or peer measured
    in the same run, and the target it answers to. A no-op when the script runs on its own."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    ratio = None
    if baseline:
        ratio = value / baseline if higher_is_better else baseline / value if value else None
    line = {
        "bench": bench,
        "figure": figure,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": baseline_label,
        "ratio": ratio,
        "target": target,
        "met": met,
        "higher_is_better": higher_is_better,
        "details": details,
    }
    with open(path, "a") as out:
        out.write(json.dumps(line, default=str) + "\n")


# ~1 KB of HTML, personalised four times ({{name}}, {{email}}, both links).
HTML = """<html><head><style>
  body { font-family: Helvetica, Arial, sans-serif; } h1 { color: #222; font-size: 22px; }
  p { color: #333; line-height: 1.5; } .cta { background: #0a7; color: #fff; padding: 8px 14px; }
</style></head><body>
<h1>The weekly letter</h1>
<p>Hello {{name}},</p>
<p>Here is what happened this week. Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do
eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud
exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.</p>
<p><a class="cta" href="https://example.com/articles/1">Read the first story</a></p>
<p>Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla
pariatur. <a href="https://example.com/articles/2">Second story</a> and
<a href="https://example.com/articles/3">a third</a>.</p>
<p style="font-size:12px">Sent to {{email}}. <a href="{{preferences_url}}">Preferences</a> ·
<a href="{{unsubscribe_url}}">Unsubscribe</a></p>
</body></html>"""

# The same letter as plain text (~0.6 KB), for benchmarks that send both parts.
TEXT = """The weekly letter

Hello {{name}},

Here is what happened this week. Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do
eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud
exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.

Read the first story: https://example.com/articles/1

Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla
pariatur. Second story: https://example.com/articles/2 and a third: https://example.com/articles/3

Sent to {{email}}. Preferences: {{preferences_url}}
Unsubscribe: {{unsubscribe_url}}
"""


def seed_subscribers(n: int, log=print) -> None:
    """Empty the newsletter tables and make subscribers exactly u1..uN (user{i}@example.com,
    'User {i}'), reusing them when already there. db.init() must have been called."""
    from app.platform import db

    with db.raw_cursor() as cur:
        cur.execute("SELECT count(*), coalesce(max(id), 0) FROM subscribers")
        count, max_id = cur.fetchone()
        cur.execute(
            "TRUNCATE newsletters, email_log, email_links, email_link_history, legacy_link_codes "
            "RESTART IDENTITY CASCADE"
        )
        if count != n or max_id != n:
            log(f"seeding {n:,} subscribers")
            cur.execute("TRUNCATE subscribers RESTART IDENTITY CASCADE")
            cur.execute(
                "INSERT INTO subscribers (user_id, email, name) SELECT 'u' || g, 'user' || g || "
                "'@example.com', 'User ' || g FROM generate_series(1, %s) g",
                (n,),
            )
    db.query("VACUUM ANALYZE subscribers")


# -- processes


def seed_digest_data(n: int, events: int, now, seen_percent: int = 0, posts: int = 6) -> None:
    """n subscribers (bench-0..), all due at the local-hour slot ~1 h after `now`, with `events`
    events each over `posts` posts and 8 actors; vacuumed, as events waiting hours for their digest are.
    `seen_percent`: that share of the (subscriber, post) pairs seen in the app (issue 24's feed
    state, digest/seen.py), spread evenly."""
    from datetime import timedelta

    import psycopg2.extras

    from app.platform import db

    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE " + ", ".join(db.ALL_TABLES) + " RESTART IDENTITY CASCADE")
        hour = (now + timedelta(hours=1)).hour
        rows = [(f"bench-{i}", f"bench-{i}@example.test", f"Bench User {i}", "UTC", "daily", hour) for i in range(n)]
        psycopg2.extras.execute_values(
            cur,
            "INSERT INTO subscribers (user_id, email, name, timezone, digest_cadence, digest_hour) VALUES %s",
            rows,
            page_size=5000,
        )
        actors = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
        ev_rows = []
        for i in range(n):
            for j in range(events):
                post = j % posts
                ev_rows.append(
                    (
                        "bench",
                        f"{i}-{j}",
                        f"bench-{i}",
                        ("like", "comment", "follow")[j % 3],
                        "post",
                        f"post-{post}",
                        f"actor-{(i + j) % 8}",
                        actors[(i + j) % 8],
                        '{"title": "Post %d", "url": "https://example.test/p/%d"}' % (post, post),  # noqa: UP031 - JSON braces
                        now - timedelta(minutes=j),
                    )
                )
        psycopg2.extras.execute_values(
            cur,
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id, "
            "actor_name, payload, occurred_at) VALUES %s",
            ev_rows,
            page_size=10000,
        )
        if seen_percent > 0:
            seed_seen(cur, seen_percent, now)
    db.query("VACUUM ANALYZE digest_events")
    db.query("VACUUM ANALYZE subscribers")


def seed_seen(cur, percent: int, now, subscriber_ids: list[int] | None = None) -> None:
    """`percent` of the (subscriber, post-0..5) pairs marked seen up to `now` (every `100 / percent`th)."""
    cur.execute(
        "INSERT INTO feed_state (subscriber_id, entity_type, entity_id, seen_until) "
        "SELECT s.id, 'post', 'post-' || p, %(now)s FROM subscribers s CROSS JOIN generate_series(0, 5) p "
        "WHERE (s.id * 6 + p) %% %(every)s = 0 AND (%(ids)s::bigint[] IS NULL OR s.id = ANY (%(ids)s::bigint[])) "
        "ON CONFLICT DO NOTHING",
        {"now": now, "every": max(1, round(100 / percent)), "ids": subscriber_ids},
    )


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of a process from /proc/<pid>/stat (plus cutime + cstime, the CPU of its
    children it has reaped, when `children`); 0.0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11 : 15 if children else 13]) / CLK_TCK


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def group_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds of each live process in a process group (a worker started in its own session)."""
    return {pid: cpu_seconds(pid) for pid in group_pids(pgid)}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two group_cpu() snapshots by processes alive at the second one."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def peak_rss_mb(pgid: int) -> tuple[float, float]:
    """(max VmHWM over the worker processes, VmHWM of the dramatiq parent) in MB."""
    peaks = {}
    for pid in group_pids(pgid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks[pid] = int(line.split()[1]) / 1024
        except FileNotFoundError:
            pass
    workers = [v for pid, v in peaks.items() if pid != pgid]
    return (max(workers) if workers else 0.0), peaks.get(pgid, 0.0)


def stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM a process group (dramatiq parent + worker processes, uvicorn); SIGKILL if stuck."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_heartbeats(redis_url: str, processes: int, worker: subprocess.Popen, timeout: float = 60) -> None:
    """Ready when every Dramatiq worker process has registered its Redis heartbeat."""
    import redis

    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.zcard("dramatiq:__heartbeats__") >= processes:
            return
        if worker.poll() is not None:
            raise SystemExit("worker exited during start-up")
        time.sleep(0.1)
    raise SystemExit(f"worker did not start within {timeout:.0f} s")


class PostgresCPU:
    """CPU used by one Postgres server on behalf of one database, between start() and stop().

    Counted: every process of the server this connection reaches (children of its postmaster:
    backends, WAL writer, checkpointer, background writer, autovacuum) — live ones from
    /proc/<pid>/stat, and backends that exited in the window through the postmaster's cutime+cstime
    (the postmaster reaps them) — minus backends connected to other databases that are alive at
    either end, and minus the measuring connection itself. Backends of other databases that both
    started and ended inside the window cannot be told apart; `others_active_ms` (pg_stat_database
    active_time of the other databases over the window) says how much such noise there may be.
    Needs to run as root (or the postgres user) to read the backends' /proc entries.
    """

    def __init__(self, conn, database: str):
        self.conn, self.database = conn, database
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            self.own_pid = cur.fetchone()[0]
        self.postmaster = parent_pid(self.own_pid)

    def _snapshot(self) -> dict:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname IS NOT NULL AND datname <> %s", (self.database,)
            )
            others = {r[0] for r in cur.fetchall()}
            cur.execute(
                "SELECT coalesce(sum(active_time), 0) FROM pg_stat_database "
                "WHERE datname IS NOT NULL AND datname <> %s",
                (self.database,),
            )
            others_active = float(cur.fetchone()[0])
        procs = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if parent_pid(int(entry)) == self.postmaster:
                        procs[int(entry)] = cpu_seconds(int(entry))
                except (OSError, IndexError, ValueError):
                    pass
        return {
            "procs": procs,
            "others": others | {self.own_pid},
            "others_active_ms": others_active,
            "postmaster": cpu_seconds(self.postmaster, children=True),
        }

    def start(self) -> None:
        self.before = self._snapshot()

    def stop(self) -> dict:
        b, a = self.before, self._snapshot()
        excluded = b["others"] | a["others"]
        total = a["postmaster"] - b["postmaster"]  # itself + every child reaped meanwhile
        total += sum(cpu - b["procs"].get(pid, 0.0) for pid, cpu in a["procs"].items())  # live children
        total -= sum(cpu for pid, cpu in b["procs"].items() if pid not in a["procs"])  # counted in cutime
        others = sum(
            a["procs"].get(pid, b["procs"].get(pid, 0.0)) - b["procs"].get(pid, 0.0)
            for pid in excluded
            if pid in a["procs"]
        )
        return {"seconds": total - others, "others_active_ms": a["others_active_ms"] - b["others_active_ms"]}
