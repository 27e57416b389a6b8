"""Held mail released at the end of quiet hours (issue 40, item 8): N subscribers whose send-now mail
waited overnight in their quiet hours (22:00-07:00 in their zone) get it at 07:00, all at once.

    .venv/bin/python scripts/bench/hold_release.py [--subscribers 100000] [--events 5] [--delay-ms 0]
    .venv/bin/python scripts/bench/hold_release.py --subscribers 5000      # a quick run

Two phases in one run, the same N and data, the same workers as scripts/bench/digest.py (`dramatiq
actors`, 2 processes x 8 threads, claim batch 100), the same loopback SMTP sink (smtp_sink.py):
  release   N `immediately` subscribers with quiet hours 22:00-07:00 in a zone where it is now
            07:xx (Etc/GMT±h: the window has just ended), each with the send-now run quiet hours
            held (digest/runs.py HOLD's row: `pending`, held_at 03:00, due at 07:00) and `--events`
            events that came during the night. Each mail is the "while you were away" digest.
  ordinary  the baseline: the same N subscribers as daily digest subscribers without quiet hours,
            each with an ordinary digest run due at the same moment, the same events: an ordinary
            wave of as many digests.
The scheduler's checker is ticked by the bench (as digest.py does) from the moment the workers are
up; figure = mails/s from that first tick after the window's end until the sink accepted the N-th
mail. The point: a release is an ordinary wave (the claim's quiet-hours check and the held wording
cost nothing that shows), ratio = release / ordinary. --rounds > 1 alternates the order.

Everything on 127.0.0.1; its own database (notify_bench_hold) and Redis db (14); bounded by --timeout.
"""

from __future__ import annotations

import argparse
import os
import select
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
    p.add_argument("--subscribers", type=int, default=100_000, help="subscribers whose held mail is released")
    p.add_argument("--events", type=int, default=5, help="events each subscriber's held mail carries")
    p.add_argument("--delay-ms", type=float, default=0.0, help="the sink's reply delay per message")
    p.add_argument("--processes", type=int, default=2, help="worker processes (both phases)")
    p.add_argument("--threads", type=int, default=8, help="worker threads per process (both phases)")
    p.add_argument("--claim-batch", type=int, default=100, help="runs per actor message")
    p.add_argument("--rounds", type=int, default=1, help="pairs of phases; the order alternates each round")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_hold")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    p.add_argument("--port", type=int, default=2531, help="sink port on 127.0.0.1")
    p.add_argument("--timeout", type=float, default=900.0, help="give up on one phase after this many seconds")
    return p.parse_args()


args = parse_args()

for url in (args.database_url, args.redis_url):
    if urlparse(url).hostname not in ("127.0.0.1", "localhost"):
        sys.exit("the benchmark runs against 127.0.0.1 only")
if urlparse(args.redis_url).path.strip("/") in ("", "0"):
    sys.exit("the benchmark flushes its Redis db: give it its own (not db 0), e.g. redis://127.0.0.1:6379/14")
if urlparse(args.database_url).path.lstrip("/") in ("notify", "notify_test"):
    sys.exit("the benchmark truncates its database: give it its own (default notify_bench_hold)")

ENV = {
    **os.environ,
    "APP_ENV": "development",
    "DATABASE_URL": args.database_url,
    "REDIS_URL": args.redis_url,
    "MAIL_PROVIDER": "smtp",
    "SMTP_URL": f"smtp://127.0.0.1:{args.port}",
    "DIGEST_CLAIM_BATCH": str(args.claim_batch),
    "DIGEST_STAGGER_SECONDS": "0",
    "DIGEST_QUEUE_MAX_DEPTH": "100000",  # the bench enqueues all; the bound is tested elsewhere
    "DEFAULT_QUIET_HOURS": "",
    "LOG_LEVEL": "WARNING",
    "PYTHONPATH": str(ROOT),
}
os.environ.update(ENV)

import redis  # noqa: E402

from app.platform import config, db, migrate, timezones  # noqa: E402
from scripts.bench import shared  # noqa: E402

config.reload()
BIN = Path(sys.executable).parent
WINDOW = "22:00-07:00"
END_HOUR = 7


def seven_oclock_zone(now: datetime) -> tuple[str, datetime]:
    """A zone where it is 07:xx now (Etc/GMT-h is UTC+h) and the 07:00 that just passed there (UTC)."""
    offset = (END_HOUR - now.hour) % 24
    offset = offset - 24 if offset > 14 else offset  # Etc/GMT zones run from UTC-12 to UTC+14
    name = "Etc/GMT" if offset == 0 else f"Etc/GMT{-offset:+d}"
    if not timezones.valid(name):
        raise SystemExit(f"{name} is not a zone a subscriber may have (app/platform/timezones.py)")
    return name, now.replace(minute=0, second=0, microsecond=0)


def seed(kind: str, n: int, events: int, zone: str, end: datetime) -> None:
    """Fresh tables; n subscribers with `events` events each from the night, and one run each due
    at `end`: the held send-now run (release) or an ordinary daily digest run (ordinary)."""
    release = kind == "release"
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE " + ", ".join(db.ALL_TABLES) + " RESTART IDENTITY CASCADE")
        cur.execute(
            "INSERT INTO subscribers (user_id, email, name, timezone, digest_cadence, digest_hour, quiet_hours, "
            "digest_planned_until) SELECT 'hold-' || g, 'hold-' || g || '@example.test', 'Held User ' || g, %s, %s, "
            "7, %s, %s FROM generate_series(1, %s) g",
            (zone, "immediately" if release else "daily", WINDOW if release else None, end + timedelta(days=1), n),
        )
        cur.execute(
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, actor_id, "
            "actor_name, payload, occurred_at) "
            "SELECT 'bench', g || '-' || k, 'hold-' || g, (ARRAY['comment', 'like', 'follow'])[1 + k %% 3], 'post', "
            "'post-' || (k %% 3), 'actor-' || ((g + k) %% 8), 'Actor ' || ((g + k) %% 8), "
            "json_build_object('title', 'Post ' || (k %% 3), 'url', 'https://example.test/p/' || (k %% 3)), "
            "%s - make_interval(mins => 20 * k) FROM generate_series(1, %s) g, generate_series(1, %s) k",
            (end, n, events),
        )
        # Yesterday's mail, sent: subscribers with a history, as in production. Without it the
        # statistics say no run was ever sent, and the claim's "previous mail" lookup (LAST_SENT_AT)
        # walks digest_runs_sent_idx, a scan that grows with every run sent in the wave.
        cur.execute(
            "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status, completed_at, "
            "event_count) SELECT id, %s, %s, %s, 'sent', %s, 3 FROM subscribers",
            (
                "immediately" if release else "daily",
                (end - timedelta(days=1)).date(),
                end - timedelta(hours=13),
                end - timedelta(hours=13),
            ),
        )
        if release:  # the row digest/runs.py HOLD leaves: pending, due at the window's end, held_at kept
            slot = int((end - end.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds() * 1000)
            cur.execute(
                "INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for, next_attempt_at, "
                "held_at) SELECT id, 'immediately', %s, %s, %s, %s, %s FROM subscribers",
                (end.date(), slot, end, end, end - timedelta(hours=4)),
            )
        else:
            cur.execute(
                "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for) "
                "SELECT id, 'daily', %s, %s FROM subscribers",
                (end.date(), end),
            )
    for table in ("subscribers", "digest_events", "digest_runs"):
        db.query(f"VACUUM ANALYZE {table}")


class Sink:
    """scripts/bench/smtp_sink.py with --expect n: the CLOCK_MONOTONIC moment it accepted the n-th mail."""

    def __init__(self, n: int):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts/bench/smtp_sink.py"), "--port", str(args.port)]
            + ["--delay-ms", str(args.delay_ms), "--expect", str(n)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.buf = b""
        self.reached_at: float | None = None
        self.received = 0
        if self.line(time.monotonic() + 30) != "ready":
            self.stop()
            raise SystemExit("sink did not start")

    def line(self, deadline: float) -> str | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        text = raw.decode().strip()
        if text.startswith("reached "):
            self.reached_at = float(text.split()[2])
        elif text.startswith("received "):
            self.received = int(text.split()[1])
        return text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while self.line(deadline) is not None:
            pass
        self.proc.wait(timeout=20)


def start_workers(rclient) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(BIN / "dramatiq"), "actors", "--processes", str(args.processes), "--threads", str(args.threads)]
        + ["--queues", "digest"],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    shared.wait_heartbeats(args.redis_url, args.processes, proc)
    time.sleep(1.0)  # the processes' threads are up a moment after their heartbeat
    return proc


def open_runs() -> int:
    return db.query(
        "SELECT (SELECT count(*) FROM digest_runs WHERE status = 'pending') + "
        "(SELECT count(*) FROM digest_runs WHERE status = 'processing')"
    )[0][0]


def phase(kind: str, rclient) -> dict:
    from app.cli import scheduler
    from digest import plan as digest_plan

    n = args.subscribers
    zone, end = seven_oclock_zone(datetime.now(UTC))
    seeded = time.monotonic()
    seed(kind, n, args.events, zone, end)
    seed_seconds = time.monotonic() - seeded
    rclient.flushdb()
    sink = Sink(n)
    workers = start_workers(rclient)
    send, depth = scheduler._digest_sender()
    cpu_before = shared.group_cpu(workers.pid)
    try:
        started = time.monotonic()  # the checker's first tick after the window's end
        deadline, ticks = started + args.timeout, 0
        while time.monotonic() < deadline:
            if ticks % 5 == 0:
                digest_plan.check(datetime.now(UTC), send, depth())
            ticks += 1
            sink.line(time.monotonic() + 0.1)
            if sink.reached_at is not None and open_runs() == 0:
                break
        finished = time.monotonic()
        worker_cpu = shared.cpu_delta(cpu_before, shared.group_cpu(workers.pid))
    finally:
        shared.stop_group(workers)
        sink.stop()
    statuses = dict(db.query("SELECT status, count(*) FROM digest_runs GROUP BY status"))
    held_sent = db.query("SELECT count(*) FROM digest_runs WHERE status = 'sent' AND held_at IS NOT NULL")[0][0]
    last = sink.reached_at or finished
    seconds = last - started
    ok = sink.reached_at is not None and statuses.get("sent", 0) == 2 * n and sink.received == n
    if kind == "release":
        ok = ok and held_sent == n
    result = {
        "kind": kind,
        "zone": zone,
        "end": end,
        "seconds": seconds,
        "rate": n / seconds if ok else 0.0,
        "statuses": statuses,
        "received": sink.received,
        "ok": ok,
        "seed_seconds": seed_seconds,
        "worker_cpu_ms": worker_cpu / n * 1000,
    }
    print(
        f"  {kind:<8} {n:,} mails, window end 07:00 {zone} ({end:%H:%M} UTC): last mail at the sink "
        f"{seconds:6.2f} s after the first tick = {result['rate']:7.0f} mails/s; runs {statuses}, sink got "
        f"{sink.received:,}; worker CPU {result['worker_cpu_ms']:.2f} ms/mail; seeded in {seed_seconds:.0f} s"
        + ("" if ok else "  INCOMPLETE"),
        flush=True,
    )
    return result


def main() -> int:
    migrate.migrate(args.database_url)  # creates the database if it is missing
    db.init(args.database_url)
    rclient = redis.Redis.from_url(args.redis_url)
    print(
        f"hold-release bench: {args.subscribers:,} subscribers x {args.events} events; {args.processes} worker "
        f"processes x {args.threads} threads; claim batch {args.claim_batch}; sink delay {args.delay_ms:g} ms; "
        f"{os.cpu_count()} CPUs; load average before {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[str, list[dict]] = {"release": [], "ordinary": []}
    for r in range(args.rounds):
        order = ("release", "ordinary") if r % 2 == 0 else ("ordinary", "release")
        for kind in order:
            results[kind].append(phase(kind, rclient))
    rclient.flushdb()
    best = {kind: max(rows, key=lambda x: x["rate"]) for kind, rows in results.items()}
    release, ordinary = best["release"], best["ordinary"]
    ratio = release["rate"] / ordinary["rate"] if ordinary["rate"] else float("inf")
    print(
        f"\nsummary: release {release['rate']:,.0f} mails/s vs an ordinary wave {ordinary['rate']:,.0f} mails/s "
        f"({ratio:.2f}x); load average after {os.getloadavg()[0]:.1f}"
    )
    shared.record(
        f"held mail released at 07:00, {args.subscribers:,} subscribers, relay {args.delay_ms:g} ms",
        "mails/s (window end -> last mail at the sink)",
        release["rate"],
        "mails/s",
        baseline=ordinary["rate"],
        baseline_label="an ordinary wave of as many due digests, same run",
        target=">= 0.9x an ordinary wave",
        met=release["ok"] and ordinary["ok"] and ratio >= 0.9,
        subscribers=args.subscribers,
        events=args.events,
        processes=args.processes,
        threads=args.threads,
        claim_batch=args.claim_batch,
        delay_ms=args.delay_ms,
        rounds=args.rounds,
        seconds=round(release["seconds"], 3),
        baseline_seconds=round(ordinary["seconds"], 3),
        worker_cpu_ms_per_mail=round(release["worker_cpu_ms"], 3),
        baseline_worker_cpu_ms_per_mail=round(ordinary["worker_cpu_ms"], 3),
    )
    return 0 if release["ok"] and ordinary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
