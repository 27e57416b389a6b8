"""Where a digest's CPU goes: the worker's code path (digest.send.process: claim, load, group,
render, rewrite links, build MIME, SMTP, record) under cProfile in one process, and the Postgres
server's CPU for the same batches, measured from /proc.

    .venv/bin/python scripts/bench/profile_digest.py [--subscribers 3000] [--tracking/--no-tracking]
                                                     [--stages | --statements]

Prints CPU per digest (worker vs Postgres), the worker's time by area, and the top functions by
own time. The SMTP sink is scripts/bench/smtp_sink.py at 0 ms on a spare port. cProfile slows
Python down by about 1.5-2x: the split by area is what to read, not the absolute figure (the
end-to-end figure is scripts/bench/digest.py's). --stages leaves cProfile out and sums the thread's
CPU time inside each step of the path instead (build.render_mail, rewrite_many_with_clicks, the
provider, ...): unslowed, but one process in a loop, so the figures are above a worker's. Its own
database (notify_bench_profile). The collector is tuned as a worker's (gc.freeze, threshold 50,000).
--statements: the Postgres backend's CPU per kind of statement (schedstat before and after each).
The profile of the workers as they run, eight threads and all: scripts/bench/digest.py --sample.

What it showed (2,000 subscribers x 20 events, tracking on): the biggest item was one email_links
round trip per digest (SAVEPOINT, INSERT … RETURNING, RELEASE: 3 of the ~3.1 statements per
digest); batching them per claimed batch took the worker from 855 to 679 µs and Postgres from 463
to 337 µs per digest (profiled), and scripts/bench/digest.py at 50 ms from 1,158 to 1,592
digests/s (CPU per digest 1.43 → 0.96 ms). What is left, by size: waiting on Postgres (claim,
load, record), the Mustache render, link scanning and codes, grouping, MIME quoted-printable.

Entity-first digests (issue 11: a line per category with times, titles/links/avatars from the
best event, the previous digest's send time read in the claim) measured side by side with the
commit before them, 3,000 subscribers, alternating runs on a busy machine: worker 880-940 ->
1,000-1,280 us per digest profiled (430-490 -> 550-620 unprofiled, of which ~40 us is garbage
collection the extra allocations trigger: a worker with the web process's gc.freeze() and
threshold would not pay it), Postgres 500-590 -> 480-600 us (no measurable change: one more
statement per batch, two index probes per claimed run). Long or non-ASCII subjects are folded by
hand now (app/platform/mail.py): through the email package they cost ~0.1 ms per mail.

Issue 13, third pass (worker thread CPU per stage from a throwaway per-function wrapper inside the
real `dramatiq actors` processes of scripts/bench/digest.py at 50 ms; Postgres's WAL read with
pg_waldump): quoted-printable was the largest worker item after the link rows. binascii.b2a_qp
walks every byte (~30 µs for a digest's 4.5 KB of HTML, every attribute's "=" becoming "=3D"): ASCII
parts now go 7bit and digest HTML is written in ASCII with character references, mail.build 115 ->
60-70 µs. Every event the mark updated also got a tuple lock and two extra WAL records from a
BEFORE UPDATE trigger whose columns were never set (AFTER UPDATE now, migration 0580). Idle
Dramatiq consumers backed off up to 1 s and the checker marked all 15,000 due runs in one 0.6 s
statement before sending the first message: the first claim moved from 0.95 to 0.47 s after the
plan. End to end: CPU per digest 1.27 -> 1.12 ms, 1,312 -> 1,558 digests/s at 50 ms.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import socket
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--subscribers", type=int, default=3000)
p.add_argument("--events", type=int, default=20)
p.add_argument("--tracking", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_profile")
p.add_argument("--top", type=int, default=25)
p.add_argument(
    "--stages",
    action="store_true",
    help="no cProfile: CPU per stage (thread CPU time around each step of the worker's path), unslowed",
)
p.add_argument(
    "--statements",
    action="store_true",
    help="no cProfile: the Postgres backend's CPU per kind of statement (its /proc schedstat before and after each)",
)
args = p.parse_args()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    PORT = s.getsockname()[1]
os.environ.update(
    {
        "APP_ENV": "development",
        "DATABASE_URL": args.database_url,
        "MAIL_PROVIDER": "smtp",
        "SMTP_URL": f"smtp://127.0.0.1:{PORT}",
        "TRACKING": "1" if args.tracking else "0",
        "LOG_LEVEL": "WARNING",
    }
)

import psycopg2  # noqa: E402

from app.platform import config, db, migrate, providers  # noqa: E402
from digest import plan as digest_plan  # noqa: E402
from digest import send as digest_send  # noqa: E402
from scripts.bench import shared  # noqa: E402
from scripts.bench import stages as stages_mod  # noqa: E402

config.reload()

# Areas by where a function lives (the profile's file paths).
AREAS = [
    ("psycopg2 (waiting on Postgres, adapting)", ("psycopg2", "<method 'execute'", "<method 'fetch")),
    ("SMTP client + socket", ("providers/smtp", "asyncio", "selectors", "socket", "ssl")),
    ("MIME building (email package, app/platform/mail.py)", ("email/", "app/platform/mail.py", "dkim")),
    ("tracking: links and codes", ("tracking/",)),
    ("render (digest templates)", ("digest/render.py", "app/platform/mustache.py", "digest/context.py")),
    ("load + group", ("digest/load.py", "digest/group.py", "orjson", "json/")),
    ("claim / build / send / record glue", ("digest/",)),
    ("threads, queues, locks", ("threading", "concurrent/", "queue.py")),
]


def timed_stages() -> dict[str, float]:
    """Wrap each step of the worker's path so the thread's CPU time inside it is summed per stage
    (a stage called inside another is subtracted from it)."""
    from digest import build as digest_build
    from digest import details, seen
    from digest import load as digest_load

    timer = stages_mod.StageTimer()
    wrap = timer.wrap
    wrap(digest_send, "claim", "claim (digest/claim.py)")
    wrap(digest_load, "load", "load events (digest/load.py)")
    wrap(seen, "load", "seen state (digest/seen.py load)")
    wrap(seen, "build_digest", "group + rank (seen.build_digest)")
    wrap(details, "resolve", "titles/links/avatars (details.resolve)")
    wrap(digest_build, "render_mail", "render HTML (build.render_mail)")
    wrap(digest_build, "rewrite_many_with_clicks", "tracked links (rewrite_many_with_clicks)")
    wrap(digest_build, "render_text", "render text (build.render_text)")
    wrap(digest_build, "outgoing_mail", "OutgoingMail (build.outgoing_mail)")
    wrap(digest_send, "send", "provider: MIME + SMTP (send.send)")
    wrap(digest_send, "record", "record outcomes (send.record)")
    return timer.totals


class StatementCPU:
    """The backend's CPU time (/proc/<pid>/schedstat, nanoseconds) of each statement a connection
    runs, summed by the statement's first words: psycopg2.connect hands out connections whose
    cursors measure it (Postgres on this machine; ptrace-free, but the server's /proc must be readable)."""

    def __init__(self) -> None:
        self.by_statement: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        measure = self

        class Cursor(psycopg2.extensions.cursor):
            def execute(self, query, vars=None):
                pid = self.connection.get_backend_pid()
                before, started = measure.cpu_ns(pid), time.perf_counter()
                try:
                    return super().execute(query, vars)
                finally:
                    text = query if isinstance(query, str) else query.decode()
                    kept = measure.by_statement[" ".join(text.split())[:100]]
                    kept[0] += 1
                    kept[1] += measure.cpu_ns(pid) - before
                    kept[2] += time.perf_counter() - started

        connect = psycopg2.connect

        def connecting(*a, **kw):
            kw.setdefault("cursor_factory", Cursor)
            return connect(*a, **kw)

        psycopg2.connect = connecting

    @staticmethod
    def cpu_ns(pid: int) -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    def report(self, n: int, batches: int) -> None:
        total = sum(v[1] for v in self.by_statement.values())
        print(f"  Postgres backend CPU of the worker thread's statements: {total / 1e3 / n:.0f} us/digest")
        for text, (count, ns, wall) in sorted(self.by_statement.items(), key=lambda kv: -kv[1][1]):
            if ns / 1e3 / n >= 0.5:
                per, runs = ns / 1e3 / n, count / batches
                print(f"    {per:6.1f} us/digest  {runs:4.1f}/batch  wall {wall * 1e6 / n:6.1f} us  {text}")


def main() -> None:
    statements = StatementCPU() if args.statements else None
    migrate.migrate(args.database_url)
    db.init(args.database_url)
    now = datetime.now(UTC)
    shared.seed_digest_data(args.subscribers, args.events, now)
    digest_plan.plan(now)
    ids = [r[0] for r in db.query("SELECT id FROM digest_runs ORDER BY id")]
    sink = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/bench/smtp_sink.py"), "--port", str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    sink.stdout.readline()
    provider = providers.get_provider()
    digest_send.process(run_ids=ids[:100], provider=provider)  # warm-up: templates, connections
    gc.freeze()  # as a worker process does after boot (actors/broker.py CollectorTuning)
    gc.set_threshold(50_000, 20, 100)
    conn = psycopg2.connect(args.database_url)
    conn.autocommit = True
    pg = shared.PostgresCPU(conn, config.get().database_url.rsplit("/", 1)[-1])
    profiler = cProfile.Profile()
    stages = timed_stages() if args.stages else None
    if statements is not None:
        statements.by_statement.clear()  # the warm-up's are not counted
    pg.start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if not stages and statements is None:
        profiler.enable()
    for k in range(100, len(ids), 100):
        digest_send.process(run_ids=ids[k : k + 100], provider=provider)
    profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    pg_cpu = pg.stop()["seconds"]
    n = len(ids) - 100
    sent = db.query("SELECT count(*) FROM digest_runs WHERE status = 'sent'")[0][0]
    providers.close_all()
    sink.terminate()

    if statements is not None:
        print(f"profile_digest --statements: {n} digests, {args.events} events each")
        per = 1e6 / n
        print(f"  wall {wall:.1f} s; worker CPU {cpu * per:.0f} us/digest; Postgres CPU {pg_cpu * per:.0f} us/digest")
        statements.report(n, len(range(100, len(ids), 100)))
        return
    if stages is not None:
        tracking = "on" if args.tracking else "off"
        print(f"profile_digest --stages: {n} digests, {args.events} events each, tracking {tracking}")
        per = 1e6 / n
        print(f"  wall {wall:.1f} s; worker CPU {cpu * per:.0f} us/digest; Postgres CPU {pg_cpu * per:.0f} us/digest")
        print("  worker thread CPU by stage (nested stages are not counted in their parent):")
        for stage, seconds in sorted(stages.items(), key=lambda kv: -kv[1]):
            print(f"    {stage:<40s} {seconds / n * 1e6:7.0f} us/digest")
        rest = (cpu - sum(stages.values())) * per
        print(f"    {'(rest: the batch glue, other threads)':<40s} {rest:7.0f} us/digest")
        return
    stats = pstats.Stats(profiler)
    by_area, total = stages_mod.by_area(stats, AREAS)
    print(
        f"profile_digest: {n} digests ({sent} sent incl. warm-up), {args.events} events each, tracking "
        f"{'on' if args.tracking else 'off'}, under cProfile"
    )
    print(
        f"  wall {wall:.1f} s; worker CPU {cpu / n * 1e6:.0f} us/digest (profiled); "
        f"Postgres CPU {pg_cpu / n * 1e6:.0f} us/digest"
    )
    print("  worker time by area (own time, share of the profiled total):")
    for area, seconds in sorted(by_area.items(), key=lambda kv: -kv[1]):
        print(f"    {area:<46s} {seconds / n * 1e6:7.0f} us/digest  {seconds / total:6.1%}")
    print(f"  top {args.top} functions by own time:")
    stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(args.top)


if __name__ == "__main__":
    main()
