"""Digest pipeline benchmark: N subscribers x 20 events through scheduler + workers to a loopback
SMTP sink, at 0 ms and 50 ms per message, against a naive baseline measured in the same run.

    .venv/bin/python scripts/bench/digest.py [--subscribers 5000] [--delays 0,50] [--no-tracking]
    .venv/bin/python scripts/bench/digest.py --no-baseline --processes 4    # one point of a scaling sweep

Per delay:
  ours      the scheduler's tick plans the runs and its checker enqueues batches (bounded queue
            depth); `dramatiq actors` workers claim batches with SKIP LOCKED, render from cached
            tokens and send over pooled SMTP connections; then one commit per batch.
  baseline  one task per subscriber (`dramatiq scripts.bench.digest_naive`), premailer and the
            email package per mail, a new SMTP connection per mail. Same worker processes/threads.
Figure = digests/s from the first tick until every run is `sent` (time to plan included).
CPU per digest = the workers', their Postgres backends' and the sink's CPU from the workers being
ready until every run is sent, over the digests sent; each worker process's start-up (imports,
1.8-2.1 s) is printed apart, not counted (until 2026-11-28 it was: ~0.27 ms a digest at 15,000).
Target: ours >= 20x the naive baseline, >= 3,000 digests/s at 0 ms and 2,800 at 50 ms (issue 42).
--no-baseline measures ours only (a sweep over --processes needs no baseline per point).

Everything on 127.0.0.1; its own database (notify_bench_digest) and Redis db; bounded by --timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=15000, help="subscribers for our pipeline (20 events each)")
    p.add_argument(
        "--baseline-subscribers",
        type=int,
        default=0,
        help="subscribers for the naive baseline (default: min(subscribers, 1000); it is slow)",
    )
    p.add_argument("--events", type=int, default=20, help="events per subscriber")
    p.add_argument(
        "--posts", type=int, default=6, help="posts the events are about, per subscriber (the soak's: one per event)"
    )
    p.add_argument(
        "--seen-percent",
        type=int,
        default=0,
        help="share of the subscribers' posts seen in the app before the digest (issue 24; 10 for its check)",
    )
    p.add_argument("--delays", default="0,50", help="per-message sink delays in ms, comma separated")
    p.add_argument("--processes", type=int, default=2, help="worker processes (both pipelines)")
    p.add_argument("--threads", type=int, default=8, help="worker threads per process (both pipelines)")
    # Little's law: 2,000 mails/s at a 50 ms round trip keep 100 sends in flight, 50 per process,
    # plus headroom for the moments a lane waits on its batch's claim or commit.
    p.add_argument(
        "--smtp-pool",
        type=int,
        default=None,
        help="SMTP_POOL_SIZE for ours (default: the service's own, which grows by itself)",
    )
    p.add_argument("--claim-batch", type=int, default=100, help="runs per actor message (ours)")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_digest")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    p.add_argument("--port", type=int, default=2526, help="sink port on 127.0.0.1")
    p.add_argument("--timeout", type=float, default=240.0, help="give up on one phase after this many seconds")
    p.add_argument(
        "--tracking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rewrite links for click tracking, as production does (default on; --no-tracking)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the naive baseline phases (ours only)")
    p.add_argument(
        "--sample",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ours: py-spy samples the worker processes for SECONDS mid-wave and prints where their CPU went "
        "(scripts/bench/sampling.py); use enough subscribers that the wave outlasts it",
    )
    p.add_argument(
        "--sample-after", type=float, default=3.0, help="seconds after the first tick before --sample begins"
    )
    p.add_argument(
        "--label",
        default="digest pipeline",
        help="names this run in the report (BENCH_RESULTS); tracking and the relay delay are appended",
    )
    return p.parse_args()


args = parse_args()


def db_name_of(url: str) -> str:
    return urlparse(url).path.lstrip("/")


for url in (args.database_url, args.redis_url):
    if urlparse(url).hostname not in ("127.0.0.1", "localhost"):
        sys.exit("the benchmark runs against 127.0.0.1 only")
if urlparse(args.redis_url).path.strip("/") in ("", "0"):
    sys.exit("the benchmark flushes its Redis db: give it its own (not db 0), e.g. redis://127.0.0.1:6379/11")
if db_name_of(args.database_url) in ("notify", "notify_test"):
    sys.exit("the benchmark truncates its database: give it its own (default notify_bench_digest)")

ENV = {
    **os.environ,
    "APP_ENV": "development",
    "DATABASE_URL": args.database_url,
    "REDIS_URL": args.redis_url,
    "MAIL_PROVIDER": "smtp",
    "SMTP_URL": f"smtp://127.0.0.1:{args.port}",
    **({"SMTP_POOL_SIZE": str(args.smtp_pool)} if args.smtp_pool else {}),
    "DIGEST_CLAIM_BATCH": str(args.claim_batch),
    "DIGEST_STAGGER_SECONDS": "600",
    "DIGEST_QUEUE_MAX_DEPTH": "100000",  # the bench enqueues all; the bound is tested elsewhere
    "TRACKING": "1" if args.tracking else "0",
    "LOG_LEVEL": "WARNING",
    "PYTHONPATH": str(ROOT),
}
os.environ.update(ENV)

import redis  # noqa: E402

from app.platform import config, db, migrate  # noqa: E402
from scripts.bench import sampling, shared  # noqa: E402

config.reload()
BIN = Path(sys.executable).parent


def ensure_database() -> None:
    migrate.migrate(args.database_url)  # creates the database if it is missing
    db.init(args.database_url)


def load_data(n: int, events: int, now: datetime) -> None:
    shared.seed_digest_data(n, events, now, args.seen_percent, args.posts)


WORKER_LOG = Path("/tmp/notify-bench-digest-worker.log")


def start(cmd: list[str], log: Path | None = None) -> subprocess.Popen:
    """`log`: the process writes there, not to a pipe read only at its end (a worker logging errors
    at every message would fill the pipe and block, and the phase would stall instead of failing)."""
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 - the process writes to it
    return subprocess.Popen(
        cmd, env=ENV, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def stop(proc: subprocess.Popen, timeout: float = 20) -> str:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return out or ""


def start_sink(delay_ms: float) -> subprocess.Popen:
    proc = start(
        [
            sys.executable,
            str(ROOT / "scripts/bench/smtp_sink.py"),
            "--port",
            str(args.port),
            "--delay-ms",
            str(delay_ms),
        ]
    )
    line = proc.stdout.readline()
    if "ready" not in line:
        raise SystemExit(f"sink did not start: {line}{stop(proc)}")
    return proc


def start_workers(module: str, queue: str, broker_client) -> subprocess.Popen:
    proc = start(
        [
            str(BIN / "dramatiq"),
            module,
            "--processes",
            str(args.processes),
            "--threads",
            str(args.threads),
            "--queues",
            queue,
        ],
        log=WORKER_LOG,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ready when every process registered a Redis heartbeat
        if broker_client.zcard("dramatiq:__heartbeats__") >= args.processes:
            time.sleep(1.0)
            return proc
        if proc.poll() is not None:
            stop(proc)
            raise SystemExit("workers exited:\n" + WORKER_LOG.read_text()[-5000:])
        time.sleep(0.2)
    stop(proc)
    raise SystemExit("workers did not start:\n" + WORKER_LOG.read_text()[-5000:])


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, and the same for reaped children (dramatiq's worker processes)
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def worker_pids(workers: subprocess.Popen) -> list[int]:
    """The worker processes dramatiq forked (its process group, the parent left out)."""
    group = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == workers.pid and int(name) != workers.pid:
                    group.append(int(name))
            except OSError:
                pass
    return group


def phase_cpu(workers: subprocess.Popen, sink: subprocess.Popen, since: datetime) -> dict:
    """CPU seconds used by this phase: worker processes, their Postgres backends, the sink.
    Other load on the machine slows the wall clock figure; this one it barely moves."""
    group = worker_pids(workers)
    backends = [
        r[0]
        for r in db.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_start >= %s "
            "AND pid <> pg_backend_pid()",
            (since,),
        )
    ]
    return {
        "workers": sum(map(_cpu_seconds, group)),
        "postgres": sum(map(_cpu_seconds, backends)),
        "sink": _cpu_seconds(sink.pid),
    }


def counts() -> dict:
    return dict(db.query("SELECT status, count(*) FROM digest_runs GROUP BY status"))


def wait_all_done(deadline: float, on_poll=None) -> bool:
    """Poll until no run is pending or processing. Both states are covered by partial indexes, so
    the poll stays cheap (a GROUP BY over all runs every 50 ms took ~10% of a core from the workers)."""
    while time.monotonic() < deadline:
        if on_poll:
            on_poll()
        left = db.query(
            "SELECT (SELECT count(*) FROM digest_runs WHERE status = 'pending') + "
            "(SELECT count(*) FROM digest_runs WHERE status = 'processing')"
        )[0][0]
        if left == 0:
            return True
        time.sleep(0.1)
    return False


def run_phase(label: str, n: int, delay_ms: float, rclient, module: str, queue: str, drive) -> tuple:
    """Fresh data, a sink and workers; drive(now, started) schedules the work and waits for it.
    Returns (seconds, run counts, mails the sink got, CPU use)."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    load_data(n, args.events, now)
    rclient.flushdb()
    phase_start = datetime.now(UTC)
    sink = start_sink(delay_ms)
    workers = start_workers(module, queue, rclient)
    # What the processes spent starting (imports, connections: 1.8-2.1 s a worker process) is not a
    # digest's: counted apart, so CPU per digest is the steady state's whatever the run's size.
    at_start = phase_cpu(workers, sink, phase_start)
    sampler = None
    if args.sample and label == "ours":
        sampler = sampling.Sampler(worker_pids(workers), args.sample, args.sample_after).start()
    try:
        started = time.monotonic()
        ok, extra = drive(now, started)
        elapsed = time.monotonic() - started
        cpu = {k: v - at_start[k] for k, v in phase_cpu(workers, sink, phase_start).items()}
        cpu.update(extra, startup_workers=at_start["workers"])
        peak_rss = shared.peak_rss_mb(workers.pid)[0]  # the largest worker process's VmHWM
    finally:
        stop(workers)
        received = int((stop(sink).strip().split() or ["0"])[-1] or 0)
    if sampler is not None:
        print(sampler.report())
    if not ok:
        print(f"  {label}: TIMEOUT after {args.timeout}s: {counts()}; the workers' log ends:")
        print(WORKER_LOG.read_text()[-3000:])
    return elapsed, counts(), received, {**cpu, "peak_rss_mb": peak_rss}


def drive_ours(now: datetime, started: float) -> tuple[bool, dict]:
    from app.cli import scheduler
    from digest import plan as digest_plan

    due = now + timedelta(hours=2)  # past every slot + stagger
    scheduler.tick(now)  # plans the runs (none due yet)
    planned_in = time.monotonic() - started
    ticks = [0]
    send, depth = scheduler._digest_sender()

    def next_tick():  # the scheduler's checker, ticking fast for the bench
        if ticks[0] % 5 == 0:
            digest_plan.check(due, send, depth())
        ticks[0] += 1

    return wait_all_done(started + args.timeout, next_tick), {"plan_seconds": planned_in}


def drive_baseline(now: datetime, started: float) -> tuple[bool, dict]:
    from digest import plan as digest_plan
    from scripts.bench import digest_naive

    digest_plan.plan(now)
    for (run_id,) in db.query("SELECT id FROM digest_runs ORDER BY id"):  # one task per subscriber
        digest_naive.naive_send_digest.send(run_id)
    return wait_all_done(started + args.timeout), {}


TARGET_SPEEDUP = 20.0  # ours against the naive baseline, at every delay (issue 42; 10 before it)
TARGET_RATE = {0: 3000.0, 50: 2800.0}  # digests/s by relay delay on 2 quiet cores (issue 42; 1,500 at 50 ms before)


def cpu_per_digest_ms(cpu: dict, n: int) -> dict:
    """CPU milliseconds per sent digest by part (workers, postgres, sink); empty when nothing was sent."""
    return {k: v / n * 1000 for k, v in cpu.items() if k in ("workers", "postgres", "sink")} if n else {}


def record_delay(delay: float, ours: dict, base: dict | None) -> None:
    """The figures of one delay for BENCHMARKS.md (scripts/bench/report.py)."""
    bench = f"{args.label}, tracking {'on' if args.tracking else 'off'}, relay {delay:g} ms"
    details = {
        "delay_ms": delay,
        "subscribers": args.subscribers,
        "events": args.events,
        "processes": args.processes,
        "threads": args.threads,
        "tracking": args.tracking,
        "claim_batch": args.claim_batch,
        "smtp_pool": args.smtp_pool or "default",
        "sent": ours["sent"],
        "seconds": round(ours["seconds"], 3),
        "plan_seconds": round(ours["cpu"].get("plan_seconds", 0.0), 3),
        "worker_peak_rss_mb": round(ours["cpu"]["peak_rss_mb"], 1),
    }
    ours_ok = ours["sent"] == args.subscribers
    goals, met = [], ours_ok
    if base is not None:
        goals.append(f">= {TARGET_SPEEDUP:g}x naive")
        met = met and base["sent"] == base["n"] and ours["rate"] >= TARGET_SPEEDUP * base["rate"]
        details.update(baseline_subscribers=base["n"], baseline_sent=base["sent"])
    if delay in TARGET_RATE:
        goals.append(f">= {TARGET_RATE[delay]:,.0f}/s at {delay:g} ms on 2 quiet cores")
        met = met and ours["rate"] >= TARGET_RATE[delay]
    naive = "naive (task + SMTP connection per mail)" if base else ""
    shared.record(
        bench,
        "digests/s",
        ours["rate"],
        "digests/s",
        baseline=base["rate"] if base else None,
        baseline_label=naive,
        target="; ".join(goals),
        met=met if goals else None,
        **details,
    )
    split = {f"{k}_ms": round(v, 4) for k, v in ours["per"].items()}
    if base is not None:
        split.update({f"baseline_{k}_ms": round(v, 4) for k, v in base["per"].items()})
    shared.record(
        bench,
        "CPU per digest (workers + postgres + sink)",
        sum(ours["per"].values()),
        "ms",
        baseline=sum(base["per"].values()) if base else None,
        baseline_label=naive,
        higher_is_better=False,
        processes=args.processes,
        threads=args.threads,
        subscribers=args.subscribers,
        tracking=args.tracking,
        delay_ms=delay,
        **split,
    )


def main() -> int:
    ensure_database()
    rclient = redis.Redis.from_url(args.redis_url)
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    base_n = args.baseline_subscribers or min(args.subscribers, 1000)
    print(
        f"digest bench: {args.subscribers} subscribers x {args.events} events "
        f"({'no baseline' if args.no_baseline else f'baseline {base_n}'}); "
        f"{args.processes} worker processes x {args.threads} threads; SMTP pool {args.smtp_pool or 'default'}/process; "
        f"claim batch {args.claim_batch}; tracking {'on' if args.tracking else 'off'}; {os.cpu_count()} CPUs"
    )
    print(f"  load average before: {os.getloadavg()[0]:.1f} (other work on the machine lowers the wall-clock figures)")
    summary = []

    def cpu_text(cpu, per):
        plan = cpu.get("plan_seconds")
        return (
            f"CPU per digest: workers {per.get('workers', 0) * 1000:.0f} us, "
            f"postgres {per.get('postgres', 0) * 1000:.0f} us, sink {per.get('sink', 0) * 1000:.0f} us"
            + (f"; planning tick {plan:.2f} s" if plan is not None else "")
            + f"; worker peak RSS {cpu['peak_rss_mb']:.0f} MB"
            + f"; worker start-up {cpu['startup_workers']:.1f} s CPU (not counted)"
        )

    for delay in delays:
        t, c, received, cpu = run_phase("ours", args.subscribers, delay, rclient, "actors", "digest", drive_ours)
        n = c.get("sent", 0)
        ours = {
            "n": args.subscribers,
            "sent": n,
            "seconds": t,
            "rate": n / t,
            "cpu": cpu,
            "per": cpu_per_digest_ms(cpu, n),
        }
        print(
            f"  delay {delay:>4.0f} ms  ours:     {n:>6} sent in {t:6.2f} s = {ours['rate']:8.0f} digests/s "
            f"(sink got {received}); {cpu_text(cpu, ours['per'])}"
        )
        base = None
        if not args.no_baseline:
            bt, bc, breceived, bcpu = run_phase(
                "baseline", base_n, delay, rclient, "scripts.bench.digest_naive", "digest_naive", drive_baseline
            )
            bn = bc.get("sent", 0)
            base = {
                "n": base_n,
                "sent": bn,
                "seconds": bt,
                "rate": bn / bt,
                "cpu": bcpu,
                "per": cpu_per_digest_ms(bcpu, bn),
            }
            print(
                f"  delay {delay:>4.0f} ms  baseline: {bn:>6} sent in {bt:6.2f} s = {base['rate']:8.0f} digests/s "
                f"(sink got {breceived}); {cpu_text(bcpu, base['per'])}"
            )
        record_delay(delay, ours, base)
        summary.append((delay, ours, base))
    print("\nsummary (digests/s end to end, scheduler tick -> all runs sent; CPU = workers + postgres + sink)")
    for delay, ours, base in summary:
        ours_cpu = sum(ours["per"].values())
        if base is None:
            print(f"  {delay:>4.0f} ms per message: ours {ours['rate']:7.0f}/s   CPU/digest {ours_cpu:.2f} ms")
            continue
        base_cpu = sum(base["per"].values())
        print(
            f"  {delay:>4.0f} ms per message: ours {ours['rate']:7.0f}/s   naive baseline {base['rate']:6.0f}/s   "
            f"speed-up {ours['rate'] / base['rate'] if base['rate'] else float('inf'):5.1f}x   "
            f"CPU/digest {ours_cpu:.2f} ms vs {base_cpu:.2f} ms"
        )
    print(f"  load average after: {os.getloadavg()[0]:.1f}")
    rclient.flushdb()
    return 0


if __name__ == "__main__":
    sys.exit(main())
