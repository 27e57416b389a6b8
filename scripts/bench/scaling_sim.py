"""The scaling model of docs/scaling.md ("Past one host: the model"), checked by simulation: N worker
"hosts" of a fraction of a core each against one Postgres on this machine.

    .venv/bin/python scripts/bench/scaling_sim.py                          # 1, 2, 4, 8 hosts x 0.2 core
    .venv/bin/python scripts/bench/scaling_sim.py --hosts 1,2,4,8,12 --quota 0.15 --seconds 15

Each point runs scripts/bench/digest.py --no-baseline --delays 0 --processes N (its seeding, scheduler
tick, checker, workers, loopback SMTP sink and CPU accounting) as a subprocess, sized so the run takes
about --seconds at the model's rate. A supervisor thread here finds each of digest.py's Dramatiq
worker processes as it starts and gives it a CPU quota of its own — one process = one host of
--quota cores:

  cgroup    a CFS bandwidth limit per worker process: cgroup v1 `cpu` (cpu.cfs_quota_us /
            cpu.cfs_period_us under /sys/fs/cgroup/cpu) or cgroup v2 (cpu.max), whichever is
            mounted writable; needs root or a delegated subtree, no daemon (no systemd).
  stop      the fallback when no cgroup is writable: a duty cycle from this thread, which reads each
            worker's CPU (per-thread schedstat, in ns) every 2 ms and SIGSTOPs it once it used its
            quota of the current period, SIGCONT at the period's end — what CFS does, coarser.

Per point it prints digests/s over the sending window (the first run due -> none left; digest.py's
own figure, from the tick, also holds the planning), worker CPU per digest over that window
(digest.py's own figure also counts each worker process's start-up: imports, template compile),
Postgres CPU per digest (digest.py: the workers' backends), the cores Postgres used, the share of
periods the quota throttled, the server connections busy on average (Little's law: digests/s x
database time per digest) and WAL bytes per digest (pg_waldump's records of this database between
the window's LSNs when pg_wal is readable and not yet recycled, else the whole server's LSN delta,
which counts other databases' writes too) — beside the model's prediction

    digests/s = min(N x quota / w,  cores / (w + p + s))

(w, p, s: worker, Postgres and sink CPU ms per digest, --worker-ms/--postgres-ms/--sink-ms, defaults
from BENCHMARKS.md's digest row): linear in the worker quota until the machine's cores are used,
past which Postgres, the sink and the driver get only what the workers leave. A calibration point
first (2 processes, no quota, --calibrate digests) measures w, p and s in the same sitting, and a
second prediction uses them: other load on the machine moves CPU per digest, and the shape is what
is checked. Own database (notify_bench_sim) and Redis db 13 by default; one point at a time; the
default sizes take about 3 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.bench import shared  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", default="1,2,4,8", help="worker processes (simulated hosts) per point, comma separated")
    p.add_argument("--quota", type=float, default=0.2, help="CPU quota of each worker process, in cores")
    p.add_argument("--period-ms", type=float, default=100.0, help="quota period (CFS default 100 ms)")
    p.add_argument("--threads", type=int, default=8, help="worker threads per process")
    p.add_argument("--events", type=int, default=20, help="events per digest")
    p.add_argument("--seconds", type=float, default=6.0, help="target sending time per point, at the model's rate")
    p.add_argument("--subscribers", type=int, default=0, help="digests per point (default: from --seconds)")
    p.add_argument("--min-subscribers", type=int, default=800)
    p.add_argument("--mechanism", choices=("auto", "cgroup", "stop"), default="auto")
    p.add_argument(
        "--calibrate",
        type=int,
        default=3000,
        help="first, this many digests with 2 worker processes and no quota: their CPU per digest gives a "
        "second prediction for this sitting's machine (0: skip)",
    )
    p.add_argument("--worker-ms", type=float, default=0.75, help="model: worker CPU ms per digest")
    p.add_argument("--postgres-ms", type=float, default=0.35, help="model: Postgres CPU ms per digest")
    p.add_argument("--sink-ms", type=float, default=0.05, help="model: SMTP sink CPU ms per digest")
    p.add_argument("--cores", type=float, default=float(os.cpu_count() or 1), help="model: cores of this machine")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_sim")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    p.add_argument("--port", type=int, default=2531, help="the sink's port on 127.0.0.1")
    p.add_argument("--timeout", type=float, default=240.0, help="digest.py's --timeout per point")
    return p.parse_args()


def predict(args, n: int, per_digest_ms: tuple[float, float, float] | None = None) -> tuple[float, str]:
    """The model's digests/s for n hosts of args.quota cores, and what bounds it; per_digest_ms =
    (worker, Postgres, sink) CPU ms per digest (default: --worker-ms, --postgres-ms, --sink-ms)."""
    w, p, s = per_digest_ms or (args.worker_ms, args.postgres_ms, args.sink_ms)
    by_workers = n * args.quota / w * 1000
    by_machine = args.cores / (w + p + s) * 1000
    return (by_workers, "worker quota") if by_workers <= by_machine else (by_machine, "the machine's cores")


# -- CPU quotas


class Quota:
    """Puts worker processes under a CPU quota of their own each, by the first mechanism that works."""

    def __init__(self, cores: float, period_ms: float, mechanism: str):
        self.cores, self.period_us = cores, int(period_ms * 1000)
        self.groups: list[Path] = []
        self.base: Path | None = None
        self.kind = "stop"
        if cores <= 0:
            self.kind = "none"  # the calibration point: no quota
        elif mechanism in ("auto", "cgroup"):
            self.kind = self._cgroup_base()
            if self.kind == "stop" and mechanism == "cgroup":
                raise SystemExit("no writable cgroup with the cpu controller (try --mechanism stop)")
        self.stopped: set[int] = set()
        self.budget_ns = cores * self.period_us * 1000
        self.throttled_periods = 0
        self.periods = 0

    def _cgroup_base(self) -> str:
        name = f"notify_scaling_sim_{os.getpid()}"
        if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
            try:
                (CGROUP_V1 / name).mkdir()
                self.base = CGROUP_V1 / name
                return "cgroup v1"
            except OSError:
                pass
        controllers = CGROUP_V2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            try:
                (CGROUP_V2 / name).mkdir()
                self.base = CGROUP_V2 / name
                (self.base / "cgroup.subtree_control").write_text("+cpu")
                return "cgroup v2"
            except OSError:
                if self.base and self.base.exists():
                    self.base.rmdir()
                self.base = None
        return "stop"

    def add(self, pid: int) -> None:
        """Give `pid` (and every thread it has or will start) a quota of its own."""
        if self.kind in ("stop", "none"):
            return
        assert self.base is not None
        group = self.base / f"host{len(self.groups)}"
        group.mkdir()
        quota = max(1000, int(self.cores * self.period_us))
        if self.kind == "cgroup v1":
            (group / "cpu.cfs_period_us").write_text(str(self.period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {self.period_us}")
        (group / "cgroup.procs").write_text(str(pid))
        self.groups.append(group)

    def throttled(self) -> tuple[int, int]:
        """(periods throttled, periods with activity) over every host so far."""
        if self.kind in ("stop", "none"):
            return self.throttled_periods, self.periods
        throttled = periods = 0
        for group in self.groups:
            stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
            throttled += int(stat.get("nr_throttled", 0))
            periods += int(stat.get("nr_periods", 0))
        return throttled, periods

    def close(self) -> None:
        for group in self.groups:
            try:
                group.rmdir()
            except OSError:
                pass  # a process still in it: the kernel frees the group when it empties and we retry
        self.groups = []
        if self.base is not None:
            for _ in range(50):
                try:
                    self.base.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)

    # the duty-cycle fallback (called from the supervisor's loop)

    def duty_cycle(self, pids: list[int], period_start: dict, now_ns: int) -> None:
        if self.kind != "stop":
            return
        period_ns = self.period_us * 1000
        for pid in pids:
            cpu = thread_cpu_ns(pid)
            start = period_start.get(pid)
            if start is None or now_ns - start[0] >= period_ns:  # a new period: everyone runs again
                if start is not None:
                    self.periods += 1
                if pid in self.stopped:
                    self.throttled_periods += 1
                    _signal(pid, signal.SIGCONT)
                    self.stopped.discard(pid)
                period_start[pid] = (now_ns, cpu)
            elif pid not in self.stopped and cpu - start[1] >= self.budget_ns:
                _signal(pid, signal.SIGSTOP)
                self.stopped.add(pid)

    def release_all(self) -> None:
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def thread_cpu_ns(pid: int) -> int:
    """CPU time of all of a process's threads in ns (schedstat: exact, unlike the ticks of /proc/stat)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pass
    except OSError:
        pass
    return total


# -- one point


def children_of(ppid: int) -> list[tuple[int, int]]:
    """(start time in ticks, pid) of the live children of `ppid`, oldest first."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid:
                out.append((int(fields[19]), int(entry)))
    return sorted(out)


class Supervisor(threading.Thread):
    """Finds digest.py's worker processes, puts each under its quota, and measures the sending window."""

    def __init__(self, args, bench: subprocess.Popen, n: int, quota: Quota):
        super().__init__(daemon=True)
        self.args, self.bench, self.n, self.quota = args, bench, n, quota
        self.workers: list[int] = []
        self.cpu_seen: dict[int, float] = {}  # last CPU seconds read per worker (kept after it exits)
        self.window: dict = {}
        self.stop_event = threading.Event()

    def worker_cpu(self) -> float:
        for pid in self.workers:
            cpu = shared.cpu_seconds(pid)
            if cpu:
                self.cpu_seen[pid] = cpu
        return sum(self.cpu_seen.values())

    def find_workers(self) -> None:
        if len(self.workers) >= self.n:
            return
        for _, leader in children_of(self.bench.pid):
            try:
                cmdline = Path(f"/proc/{leader}/cmdline").read_bytes()
            except OSError:
                continue
            if b"dramatiq" not in cmdline:
                continue
            # the first N children of the dramatiq parent are its worker processes (forks come later)
            for _, pid in children_of(leader)[: self.n]:
                if pid not in self.workers:
                    self.quota.add(pid)
                    self.workers.append(pid)

    def run(self) -> None:
        import psycopg2

        conn = None
        last_db = 0.0
        busy_samples: list[int] = []
        period_start: dict = {}
        while not self.stop_event.is_set() and self.bench.poll() is None:
            self.find_workers()
            self.quota.duty_cycle(self.workers, period_start, time.monotonic_ns())
            now = time.monotonic()
            if now - last_db >= 0.05 and self.workers:
                last_db = now
                try:
                    if conn is None:
                        conn = psycopg2.connect(self.args.database_url)
                        conn.autocommit = True
                    self.poll_db(conn, busy_samples)
                except psycopg2.Error:
                    conn = None
            time.sleep(0.002 if self.quota.kind == "stop" else 0.02)
        self.quota.release_all()
        if busy_samples:
            self.window["busy_connections"] = sum(busy_samples) / len(busy_samples)
        if conn is not None:
            conn.close()

    def poll_db(self, conn, busy_samples: list[int]) -> None:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT (SELECT count(*) FROM digest_runs WHERE status = 'pending') + "
                "(SELECT count(*) FROM digest_runs WHERE status = 'processing'), pg_current_wal_lsn(), "
                "(SELECT sum(xact_commit) FROM pg_stat_database WHERE datname <> current_database())"
            )
            left, lsn, others = cur.fetchone()
            if "start" not in self.window:
                if left > 0:
                    self.window.update(
                        start=time.monotonic(),
                        cpu0=self.worker_cpu(),
                        lsn0=lsn,
                        others0=others,
                        throttle0=self.quota.throttled(),
                    )
                return
            if "end" in self.window:
                return
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid()"
            )
            busy_samples.append(cur.fetchone()[0])
            if left == 0:
                cur.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (lsn, self.window["lsn0"]))
                self.window.update(
                    end=time.monotonic(),
                    cpu1=self.worker_cpu(),
                    wal_bytes=float(cur.fetchone()[0]),
                    lsn1=lsn,
                    other_commits=int(others - self.window["others0"]),
                    throttle1=self.quota.throttled(),
                )
            else:
                self.worker_cpu()


WALDUMP_LINE = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+)")
WALDUMP_REL = re.compile(r"rel \d+/(\d+)/\d+")


def database_wal_bytes(database_url: str, lsn0: str, lsn1: str) -> float | None:
    """WAL written for this database alone between two LSNs: pg_waldump's records that touch its
    relations, plus the commit records of their transactions. None when pg_waldump or the server's
    pg_wal cannot be read (then only the cluster-wide LSN delta is known)."""
    import glob

    import psycopg2

    waldump = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_waldump"))
    try:
        with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT current_setting('data_directory'), oid FROM pg_database WHERE datname = current_database()"
            )
            datadir, oid = cur.fetchone()
    except psycopg2.Error:
        return None
    if not waldump or not os.access(Path(datadir) / "pg_wal", os.R_OK):
        return None
    proc = subprocess.run(
        [waldump[-1], "-p", str(Path(datadir) / "pg_wal"), "-s", lsn0, "-e", lsn1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:  # a segment already recycled (a checkpoint came between): no attribution
        return None
    ours, txs, commits = 0, set(), {}
    for line in proc.stdout.splitlines():
        m = WALDUMP_LINE.search(line)
        if not m:
            continue
        size, tx = int(m.group(1)), int(m.group(2))
        if any(int(db) == oid for db in WALDUMP_REL.findall(line)):
            ours += size
            txs.add(tx)
        elif line.startswith("rmgr: Transaction"):
            commits[tx] = commits.get(tx, 0) + size
    return float(ours + sum(size for tx, size in commits.items() if tx in txs)) if ours else None


OURS = re.compile(r"ours:\s+(\d+) sent in\s+([\d.]+) s =\s+(\d+) digests/s")
CPU = re.compile(r"CPU per digest: workers (\d+) us, postgres (\d+) us, sink (\d+) us")


def run_point(args, n: int, quota_mechanism: Quota, subscribers: int = 0) -> dict:
    predicted, bound = predict(args, n)
    subscribers = (
        subscribers or args.subscribers or max(args.min_subscribers, round(predicted * args.seconds / 100) * 100)
    )
    argv = [
        sys.executable,
        str(ROOT / "scripts/bench/digest.py"),
        "--no-baseline",
        "--delays",
        "0",
        "--processes",
        str(n),
        "--threads",
        str(args.threads),
        "--events",
        str(args.events),
        "--subscribers",
        str(subscribers),
        "--database-url",
        args.database_url,
        "--redis-url",
        args.redis_url,
        "--port",
        str(args.port),
        "--timeout",
        str(args.timeout),
        "--label",
        f"scaling sim, {n} hosts x {quota_mechanism.cores:g} core",
    ]
    env = {k: v for k, v in os.environ.items() if k != shared.RESULTS_ENV}  # this script records its own rows
    env["PYTHONPATH"] = str(ROOT)
    load = os.getloadavg()[0]
    bench = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    supervisor = Supervisor(args, bench, n, quota_mechanism)
    supervisor.start()
    try:
        out, _ = bench.communicate(timeout=args.timeout + 300)
    finally:
        supervisor.stop_event.set()
        supervisor.join(timeout=10)
        quota_mechanism.close()
    ours, cpu = OURS.search(out or ""), CPU.search(out or "")
    if bench.returncode != 0 or not ours or not cpu:
        print(out)
        raise SystemExit(f"digest.py failed at {n} hosts (exit {bench.returncode})")
    sent, rate = int(ours.group(1)), float(ours.group(3))
    w = supervisor.window
    window_s = w["end"] - w["start"] if "end" in w else float("nan")
    worker_ms = (w["cpu1"] - w["cpu0"]) / sent * 1000 if "end" in w else float("nan")
    throttled = periods = 0
    if "end" in w:
        throttled, periods = (a - b for a, b in zip(w["throttle1"], w["throttle0"], strict=True))
    postgres_ms = int(cpu.group(2)) / 1000
    own_wal = database_wal_bytes(args.database_url, w["lsn0"], w["lsn1"]) if "end" in w else None
    return {
        "hosts": n,
        "quota": quota_mechanism.cores,
        "subscribers": subscribers,
        "sent": sent,
        "rate": rate,
        "predicted": predicted,
        "bound": bound,
        "window_rate": sent / window_s if window_s == window_s and window_s > 0 else float("nan"),
        "worker_ms": worker_ms,
        "worker_ms_with_startup": int(cpu.group(1)) / 1000,
        "postgres_ms": postgres_ms,
        "sink_ms": int(cpu.group(3)) / 1000,
        "postgres_cores": postgres_ms * (sent / window_s if window_s == window_s and window_s > 0 else rate) / 1000,
        "throttled": throttled / periods if periods else 0.0,
        "busy_connections": w.get("busy_connections", float("nan")),
        "wal_bytes": (own_wal if own_wal is not None else w.get("wal_bytes", float("nan"))) / sent,
        "wal_source": "pg_waldump, this database" if own_wal is not None else "LSN delta, whole server",
        "other_db_commits": w.get("other_commits", -1),
        "load_before": load,
        "workers_found": len(supervisor.workers),
    }


def _num(value: float) -> str:
    return "–" if value != value else f"{value:,.0f}"  # NaN: no calibration point


def main() -> int:
    args = parse_args()
    hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    probe = Quota(args.quota, args.period_ms, args.mechanism)
    mechanism = probe.kind
    probe.close()
    print(
        f"scaling simulation: hosts {hosts} x {args.quota:g} core each ({mechanism}, period {args.period_ms:g} ms), "
        f"{args.threads} threads per host, {args.events} events per digest, relay 0 ms, tracking on; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"model: digests/s = min(N x {args.quota:g} / {args.worker_ms:g} ms, {args.cores:g} cores / "
        f"({args.worker_ms:g} + {args.postgres_ms:g} + {args.sink_ms:g}) ms)"
    )
    here = None
    if args.calibrate:
        cal = run_point(args, 2, Quota(0, args.period_ms, args.mechanism), subscribers=args.calibrate)
        here = (cal["worker_ms"], cal["postgres_ms"], cal["sink_ms"])
        print(
            f"  calibration, 2 processes without a quota: {cal['rate']:.0f} digests/s, {cal['sent']} digests; "
            f"worker {here[0]:.2f} ms/digest ({cal['worker_ms_with_startup']:.2f} with start-up), Postgres "
            f"{here[1]:.2f}, sink {here[2]:.2f} ms/digest; busy server connections {cal['busy_connections']:.1f}; "
            f"WAL {cal['wal_bytes'] / 1024:.1f} KiB/digest ({cal['wal_source']}); load before {cal['load_before']:.1f}",
            flush=True,
        )
    rows = []
    for n in hosts:
        quota = Quota(args.quota, args.period_ms, args.mechanism)
        row = run_point(args, n, quota)
        row["predicted_here"] = predict(args, n, here)[0] if here else float("nan")
        rows.append(row)
        print(
            f"  {n:>2} hosts: {row['window_rate']:6.0f} digests/s from the first run due to the last sent "
            f"({row['rate']:.0f}/s from the tick, planning included); model {row['predicted']:.0f} ({row['bound']}), "
            f"{_num(row['predicted_here'])} with this sitting's CPU per digest; "
            f"{row['sent']} digests; worker {row['worker_ms']:.2f} ms/digest "
            f"({row['worker_ms_with_startup']:.2f} with start-up), Postgres {row['postgres_ms']:.2f} ms/digest "
            f"= {row['postgres_cores']:.2f} cores; throttled {row['throttled']:.0%} of periods; "
            f"busy server connections {row['busy_connections']:.1f}; WAL {row['wal_bytes'] / 1024:.1f} KiB/digest "
            f"({row['wal_source']}; other databases committed "
            f"{row['other_db_commits'] if row['other_db_commits'] >= 0 else 'n/a (one was dropped)'} "
            "transactions meanwhile); "
            f"load before {row['load_before']:.1f}",
            flush=True,
        )
        if row["workers_found"] != n:
            print(f"    (found {row['workers_found']} worker processes, expected {n}: the quota missed some)")
        model = f"model min(N x quota / {args.worker_ms:g} ms, {args.cores:g} cores / all CPU per digest)"
        shared.record(
            f"scaling simulation, {n} hosts x {args.quota:g} core ({mechanism})",
            "digests/s while sending",
            row["window_rate"],
            "digests/s",
            baseline=row["predicted"],
            baseline_label=model,
            **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "window_rate"},
        )
    print(
        "\n| hosts x quota | model digests/s (bound) | model, this sitting's CPU/digest | digests/s while sending "
        "(from the tick) | measured / model | worker ms | Postgres ms | Postgres cores | throttled | busy conns | "
        "WAL KiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['hosts']} x {r['quota']:g} | {r['predicted']:,.0f} ({r['bound']}) | {_num(r['predicted_here'])} | "
            f"{r['window_rate']:,.0f} ({r['rate']:,.0f}) | {r['window_rate'] / r['predicted']:.2f} | "
            f"{r['worker_ms']:.2f} | {r['postgres_ms']:.2f} | "
            f"{r['postgres_cores']:.2f} | {r['throttled']:.0%} | {r['busy_connections']:.1f} | "
            f"{r['wal_bytes'] / 1024:.1f} |"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
