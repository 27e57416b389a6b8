"""Fault drills: the real Procfile processes against their own Postgres and Redis, a recording SMTP
sink that injects faults, and one fault per drill. Every drill prints

    sent / expected / duplicates / lost / resent-after-SIGKILL / longest stall

  duplicates             a recipient got the same mail twice under two Message-IDs: never allowed
  resent-after-SIGKILL   the same Message-ID arrived twice: a process handed the mail to the relay
                         and was SIGKILLed before it committed `sent` (the one allowed case)
  lost                   expected but never delivered after recovery

    python scripts/drill.py                      # every drill at default scale (make drill)
    python scripts/drill.py --scale 0.05 --only kill_worker,redis_flush
    python scripts/drill.py --only provider_failover   # MAIL_PROVIDERS=postmark,ses, the primary 503s for 30 s
    python scripts/drill.py --only hold_release   # quiet hours end for 20,000; a worker killed mid-release

provider_failover sends through two HTTP API fakes instead of the SMTP sink (tests/fake_providers.py,
real local servers in this process) and judges more than mail: the switch to the secondary within
SWITCH_WITHIN_SECONDS of the primary's first 503, and mail back at the primary once it recovered.

Postgres and Redis run on spare ports under a temporary directory, so restarting them disturbs
nothing else on the machine. Exit status 1 if any drill lost mail or shows duplicates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg2
import redis as redis_lib
from aiosmtpd.controller import Controller

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from digest.marks import COVERING_RUNS  # noqa: E402
from tests.fake_providers import FakeAPI, FakePostmark, FakeSES, settings_for  # noqa: E402

PY = sys.executable
WORKER_THREADS = 4  # per worker process (one process each)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise SystemExit(f"drill: {name} not found (apt-get install postgresql)")
    return found


# -- services -----------------------------------------------------------------------------------
class Postgres:
    """A throwaway cluster on a spare port (as the postgres user when run as root)."""

    def __init__(self, base: Path):
        self.dir, self.port = base / "pg", free_port()
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        self.dir.mkdir(parents=True)
        if self.run_as:
            shutil.chown(base, "postgres")
            shutil.chown(self.dir, "postgres")
        subprocess.run(
            [*self.run_as, _pg_bin("initdb"), "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync"],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/notify_drill"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.run_as, _pg_bin("pg_ctl"), "-D", str(self.dir), "-w", "-t", "60", *args],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        self._ctl(
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            "-l",
            str(self.dir / "log"),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "stop")


class Redis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        client = redis_lib.Redis.from_url(self.url)
        for _ in range(100):
            with contextlib.suppress(redis_lib.ConnectionError):
                client.ping()
                return
            time.sleep(0.05)
        raise SystemExit("drill: redis-server did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- the recording sink -------------------------------------------------------------------------
@dataclass
class Sink:
    """Records (recipient, Message-ID) of every accepted mail; can answer 4xx or drop connections."""

    deliveries: list = field(default_factory=list)  # (time, recipient, message_id)
    tempfail_until: float = 0.0
    drop_until: float = 0.0  # until then, every other DATA is cut off
    drops: int = 0
    delay: float = 0.0  # seconds per message, like an ESP's round trip
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Past this many deliveries (0: never) a mail waits unanswered until `go` is set: a wave however
    # fast cannot finish before a drill's fault has happened in the middle of it.
    hold_after: int = 0
    go: threading.Event = field(default_factory=threading.Event)

    async def handle_DATA(self, server, session, envelope):
        if self.delay:
            await asyncio.sleep(self.delay)
        while self.hold_after and len(self.deliveries) >= self.hold_after and not self.go.is_set():
            await asyncio.sleep(0.01)
        if time.monotonic() < self.tempfail_until:
            return "451 4.3.0 drill: try again later"
        with self.lock:
            in_window = time.monotonic() < self.drop_until
            drop = in_window and self.drops % 2 == 0
            self.drops += in_window
        if drop:  # connection lost mid-DATA: no reply at all
            server.transport.close()
            return "421 closing"
        message_id = ""
        for line in envelope.content.split(b"\r\n"):
            if line.lower().startswith(b"message-id:"):
                message_id = line.split(b":", 1)[1].strip().decode()
                break
            if not line:
                break
        with self.lock:
            for rcpt in envelope.rcpt_tos:
                self.deliveries.append((time.monotonic(), rcpt, message_id))
        return "250 OK"


# -- the system under test ----------------------------------------------------------------------
@dataclass(frozen=True)
class Pace:
    """How long a drill's faults last and how soon work lost with a process comes back. The full
    drills (`make drill`) keep production-like margins; the small versions in `make test` shorten
    only the waits that do not depend on the load (the windows, the retry backoff's base, the time
    a killed worker's claims stay claimed), so they check the same things in less time."""

    fault_seconds: float = 10.0  # each of smtp_faults' two windows (451s, then cut connections)
    outage_seconds: float = 12.0  # the postgres_outage drills: Postgres stopped this long mid-send
    reclaim_seconds: int = 35  # RECLAIM_AFTER_SECONDS and DIGEST_PROCESSING_TIMEOUT_SECONDS
    retry_base_seconds: int = 3  # DIGEST_RETRY_BASE_SECONDS: five attempts span 15x this
    worker_kills: int | None = None  # kill_worker's kills (None: as many as KILL_WINDOW_SECONDS holds)
    provider_outage_seconds: float = 30.0  # provider_failover: the primary answers 503 this long
    hold_seconds: float = 60.0  # hold_release: the quiet hours end at the first whole minute this far ahead
    breaker_cooldown_seconds: float = 30.0  # PROVIDER_BREAKER_COOLDOWN_SECONDS (the production default)
    judge_timing: bool = True  # judge timing (the failover switch) too; printed either way


FULL = Pace()
QUICK = Pace(
    fault_seconds=3.0,
    outage_seconds=6.0,
    reclaim_seconds=20,
    retry_base_seconds=1,
    worker_kills=3,
    provider_outage_seconds=3.0,
    breaker_cooldown_seconds=2.0,
    hold_seconds=15.0,
    judge_timing=False,  # a machine the suite shares: a slow moment is no failure there
)


class System:
    def __init__(self, base: Path, pace: Pace = FULL):
        self.base = base
        self.pace = pace
        self.pg, self.redis, self.sink = Postgres(base), Redis(), Sink()
        self.smtp_port = free_port()
        # The web's listening socket is bound here and held for the drill: every web process started
        # serves it (uvicorn --fd). A port picked free and bound later by the process could be taken
        # meanwhile by any socket on the machine (a busy test run's outgoing connections), and the
        # web would never come up.
        self.web_socket = socket.socket()
        self.web_socket.bind(("127.0.0.1", 0))
        self.web_socket.listen(128)
        self.web_socket.set_inheritable(True)
        self.web_port = self.web_socket.getsockname()[1]
        self.procs: dict[str, list[subprocess.Popen]] = {"worker": [], "scheduler": [], "web": []}
        self.env = {
            **os.environ,
            "APP_ENV": "development",
            "SECRET_KEY": "drill-" + "k" * 40,
            "DATABASE_URL": self.pg.url,
            "MIGRATION_DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "MAIL_PROVIDER": "smtp",
            "SMTP_URL": f"smtp://127.0.0.1:{self.smtp_port}",
            "SMTP_TIMEOUT_SECONDS": "5",
            "SCHEDULER_INTERVAL_SECONDS": "1",
            "DIGEST_REENQUEUE_SECONDS": "5",
            "DIGEST_PROCESSING_TIMEOUT_SECONDS": str(pace.reclaim_seconds),
            "RECLAIM_AFTER_SECONDS": str(pace.reclaim_seconds),
            "DIGEST_RETRY_BASE_SECONDS": str(pace.retry_base_seconds),
            "DIGEST_STAGGER_SECONDS": "0",
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            "API_KEY_CACHE_SECONDS": "1",
            # Claims of 20 (the SMTP default is 1,000): at the small scales of `make test` a whole
            # newsletter would otherwise go in one batch between two polls, and no fault would land
            # mid-send. Smaller batches only add claims; what each drill checks is the same.
            "SEND_BATCH_SIZE": "20",
        }

    def __enter__(self):
        self.pg.start()
        self.redis.start()
        self.controller = Controller(self.sink, hostname="127.0.0.1", port=self.smtp_port)
        self.controller.start()
        subprocess.run([PY, "-m", "app", "migrate"], env=self.env, cwd=ROOT, check=True, capture_output=True)
        return self

    def __exit__(self, *exc):
        for name in list(self.procs):
            for proc in self.procs[name]:
                self.kill(proc, signal.SIGKILL)
        self.controller.stop()
        self.web_socket.close()
        with contextlib.suppress(Exception):
            self.redis.stop()
        with contextlib.suppress(Exception):
            self.pg.stop("immediate")

    def start(self, name: str) -> subprocess.Popen:
        cmd = {
            "worker": [
                PY,
                "-m",
                "dramatiq",
                "actors",
                "--processes",
                "1",
                "--threads",
                str(WORKER_THREADS),
                "--worker-shutdown-timeout",
                "30000",
            ],
            "scheduler": [PY, "-m", "app", "scheduler"],
            "web": [
                PY,
                "-m",
                "uvicorn",
                "app.web:app",
                "--fd",
                str(self.web_socket.fileno()),
                "--log-level",
                "warning",
            ],
        }[name]
        proc = subprocess.Popen(
            cmd,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
            pass_fds=(self.web_socket.fileno(),) if name == "web" else (),
            stdout=subprocess.DEVNULL,
            stderr=open(self.base / f"{name}.log", "ab"),  # noqa: SIM115 - the process keeps writing to it
        )
        self.procs[name].append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)

    def sql(self, statement: str, params=None):
        with contextlib.closing(psycopg2.connect(self.pg.url)) as conn, conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else None

    def wait_web(self) -> None:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.web_port}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise SystemExit("drill: web did not come up")

    # -- work --------------------------------------------------------------------------------
    def seed_digests(self, n: int, first: int = 0) -> None:
        """n subscribers with 5 events each and a run due now."""
        self.sql(
            "INSERT INTO subscribers (user_id, email, name, digest_planned_until) SELECT 'd' || g, "
            "'d' || g || '@example.test', 'D ' || g, now() + interval '1 day' "
            "FROM generate_series(%s, %s) g",
            (first, first + n - 1),
        )
        self.sql(
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
            "actor_id, actor_name, payload) SELECT 'drill', 'e' || g || '-' || k, 'd' || g, 'like', 'post', "
            "'p' || k, 'a' || k, 'Actor ' || k, '{\"title\": \"Post\", \"url\": \"https://example.test/p\"}' "
            "FROM generate_series(%s, %s) g, generate_series(1, 5) k",
            (first, first + n - 1),
        )
        self.sql(
            "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for) SELECT id, 'daily', "
            "current_date, now() FROM subscribers WHERE user_id LIKE 'd%%'"
        )

    def start_newsletter(self, n: int) -> None:
        """n newsletter-only subscribers (digests off) and one newsletter to everyone, via the API."""
        self.sql(
            "INSERT INTO subscribers (user_id, email, name, digest_cadence) SELECT 'n' || g, "
            "'n' || g || '@example.test', 'N ' || g, 'off' FROM generate_series(1, %s) g",
            (n,),
        )
        headers = {"Authorization": f"Bearer {self.api_key('admin')}"}
        base = f"http://127.0.0.1:{self.web_port}"
        nl = httpx.post(
            f"{base}/v1/newsletters",
            headers=headers,
            timeout=30,
            json={
                "subject": "Drill news for {{name}}",
                "html": '<p>Hi {{name}}</p><a href="https://example.test/a">read</a> '
                '<a href="{{unsubscribe_url}}">unsubscribe</a>',
            },
        ).json()["id"]
        r = httpx.post(f"{base}/v1/newsletters/{nl}/send", headers=headers, json={"audience": "all"}, timeout=30)
        r.raise_for_status()

    def api_key(self, scope: str) -> str:
        key = subprocess.run(
            [PY, "-m", "app", "create-api-key", f"drill-{uuid.uuid4().hex[:6]}", "--scope", scope],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        return key.stdout.strip()

    def expected(self) -> set[tuple[str, str]]:
        """(recipient, mail): a digest for each digest subscriber, the newsletter for everyone."""
        digests = {(r[0], "digest") for r in self.sql("SELECT email FROM subscribers WHERE user_id LIKE 'd%%'")}
        if not self.sql("SELECT 1 FROM newsletters"):
            return digests
        return digests | {
            (r[0], "newsletter")
            for r in self.sql("SELECT email FROM subscribers WHERE user_id LIKE 'd%%' OR user_id LIKE 'n%%'")
        }

    def settled(self) -> bool:
        with contextlib.suppress(psycopg2.Error):
            ((open_runs, open_rows, newsletters),) = self.sql(
                "SELECT (SELECT count(*) FROM digest_runs WHERE status IN ('pending', 'processing')), "
                "(SELECT count(*) FROM email_log WHERE status IN ('pending', 'sending')), "
                "(SELECT count(*) FROM newsletters WHERE status NOT IN ('done', 'cancelled'))"
            )
            return open_runs == 0 and open_rows == 0 and newsletters == 0
        return False


@dataclass
class Report:
    name: str
    sent: int = 0
    expected: int = 0
    duplicates: int = 0
    lost: int = 0
    resent_after_kill: int = 0
    stall: float = 0.0
    notes: str = ""
    faults: int = 0  # how many times the fault was injected
    failed_checks: list[str] = field(default_factory=list)  # a drill's own checks beyond mail (failover)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.lost == 0 and not self.failed_checks

    def line(self) -> str:
        failed = f"  FAILED: {'; '.join(self.failed_checks)}" if self.failed_checks else ""
        return (
            f"{self.name:<18} sent {self.sent:>7,} / expected {self.expected:>7,}  duplicates {self.duplicates:>3}  "
            f"lost {self.lost:>3}  resent-after-SIGKILL {self.resent_after_kill:>3}  longest stall "
            f"{self.stall:5.1f} s  {'OK' if self.ok else 'FAIL'}  {self.notes}{failed}"
        )


def mail_of(message_id: str) -> str:
    """<digest-run-12.ab12@host> -> digest; <newsletter-3-row-9.ab12@host> -> newsletter."""
    return message_id.strip("<>").split("-", 1)[0]


def tally(system: System, name: str, started: float, notes: str = "") -> Report:
    expected = system.expected()
    with system.sink.lock:
        deliveries = list(system.sink.deliveries)
    per_mail: dict[tuple[str, str], set[str]] = {}
    resent, seen = 0, set()
    for _, rcpt, mid in deliveries:
        if (rcpt, mid) in seen:
            resent += 1
        seen.add((rcpt, mid))
        per_mail.setdefault((rcpt, mail_of(mid)), set()).add(mid)
    duplicates = sum(len(mids) - 1 for mids in per_mail.values())
    times = [started] + sorted(t for t, _, _ in deliveries)
    stall = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    return Report(name, len(per_mail), len(expected), duplicates, len(expected - set(per_mail)), resent, stall, notes)


def run_until_settled(system: System, timeout: float, during=None, poll: float = 0.5) -> bool:
    """True once every row is final and every expected mail arrived; False at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if during:
            during()
        if system.settled() and len({(r, mail_of(m)) for _, r, m in list(system.sink.deliveries)}) >= len(
            system.expected()
        ):
            return True
        time.sleep(poll)
    return False


def progress(system: System) -> float:
    return len(system.sink.deliveries) / max(1, len(system.expected()))


# -- drills -------------------------------------------------------------------------------------
KILL_EVERY_SECONDS = 5.0
# A SIGKILLed worker may have handed this many mails per thread to the relay without recording them
# (digests record every 20, newsletters every 100 or 0.25 s, claims of 20 here): issue 37's bound.
RESENT_PER_THREAD_MAX = 25
KILL_WINDOW_SECONDS = 180.0


def start_load(system: System, scale: float) -> None:
    """The web process, 5,000 x scale digest subscribers and a newsletter to everyone."""
    system.start("web")
    system.wait_web()
    system.seed_digests(int(5000 * scale))
    system.start_newsletter(int(20000 * scale))


def once_past(system: System, share: float, fault) -> tuple:
    """(a hook for run_until_settled that calls fault() once delivery passed `share`, done flag).
    The sink holds the mails after that point until a second into the fault: a small wave is
    delivered in less than one poll, and would otherwise be over before the fault."""
    done = [False]
    system.sink.go.clear()
    system.sink.hold_after = int(share * len(system.expected())) + 1

    def hook():
        if not done[0] and progress(system) > share:
            # the held mails are answered a second into the fault (well inside the workers' SMTP timeout)
            threading.Timer(1.0, system.sink.go.set).start()
            fault()
            done[0] = True

    return hook, done


def drill_kill_worker(system: System, scale: float) -> Report:
    start_load(system, scale)
    system.start("scheduler")
    worker = system.start("worker")
    started, last_kill, kills = time.monotonic(), time.monotonic(), [0]
    delivered_at_start = 0  # deliveries when the current worker started
    most = system.pace.worker_kills

    def kill_every_few_seconds():
        # Killed every KILL_EVERY_SECONDS while the send runs (a restarted worker needs a moment to
        # claim and send), for at most KILL_WINDOW_SECONDS; then recovery is watched to the end.
        # With `worker_kills` (the small drill of `make test`, on a machine other tests share): that
        # many kills, each once the worker started after the last one has delivered mail, so a slow
        # start delays the kill instead of leaving the drill without progress. Not more: every kill
        # strands the runs its worker had claimed, and five strandings fail a run.
        nonlocal worker, last_kill, delivered_at_start
        if time.monotonic() - started > KILL_WINDOW_SECONDS or progress(system) >= 0.95:
            return
        spaced = not kills[0] or time.monotonic() - last_kill > KILL_EVERY_SECONDS
        if most is None:
            due = progress(system) > 0 and spaced
        else:
            due = kills[0] < most and len(system.sink.deliveries) > delivered_at_start and spaced
        if due and not system.settled():
            system.kill(worker)
            kills[0] += 1
            delivered_at_start = len(system.sink.deliveries)
            worker = system.start("worker")
            last_kill = time.monotonic()

    # Polled often: at the small scales of `make test` the whole send takes about a second.
    settled = run_until_settled(system, 900, kill_every_few_seconds, poll=0.05)
    report = tally(system, "kill -9 worker", started)
    report.notes = (
        f"({kills[0]} kills, one every {KILL_EVERY_SECONDS:g} s{'' if most is None else ' or later'}"
        f"{resent_per_thread(report.resent_after_kill, kills[0])})" + ("" if settled else " TIMED OUT")
    )
    report.faults = kills[0]
    return report


def resent_per_thread(resent: int, kills: int) -> str:
    """The note on what the kills made the relay get twice: per kill and worker thread."""
    if not kills:
        return ""
    return f"; resent {resent}: {resent / (kills * WORKER_THREADS):.1f} per kill and thread"


def one_fault(system: System, scale: float, name: str, share: float, fault, load=start_load) -> Report:
    """The load, one scheduler and one worker pool; fault() once delivery passed `share`."""
    load(system, scale)
    system.start("scheduler")
    system.start("worker")
    started = time.monotonic()
    hook, done = once_past(system, share, fault)
    run_until_settled(system, 600, hook)
    report = tally(system, name, started)
    report.faults = int(done[0])
    return report


def drill_redis_flush(system: System, scale: float) -> Report:
    def flush_and_restart():
        redis_lib.Redis.from_url(system.redis.url).flushall()
        system.redis.stop()
        time.sleep(1)
        system.redis.start()

    return one_fault(system, scale, "redis flush+restart", 0.3, flush_and_restart)


def drill_postgres_restart(system: System, scale: float) -> Report:
    start_load(system, scale)
    key = subprocess.run(
        [PY, "-m", "app", "create-api-key", "drill-events", "--scope", "events"],
        env=system.env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    accepted, statuses, stop = [], {}, threading.Event()

    def ingest():
        with httpx.Client(
            base_url=f"http://127.0.0.1:{system.web_port}", timeout=10, headers={"Authorization": f"Bearer {key}"}
        ) as client:
            while not stop.is_set():
                event_id = uuid.uuid4().hex
                try:
                    r = client.post(
                        "/v1/events",
                        json={
                            "id": event_id,
                            "user_id": "ingest",
                            "category": "like",
                            "entity_type": "post",
                            "entity_id": "p1",
                        },
                    )
                except httpx.HTTPError:
                    statuses["connection error"] = statuses.get("connection error", 0) + 1
                    continue
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 202:
                    accepted.append(event_id)

    feeder = threading.Thread(target=ingest, daemon=True)
    feeder.start()
    system.start("scheduler")
    system.start("worker")
    started = time.monotonic()

    def restart():
        system.pg.stop("fast")
        time.sleep(3)
        system.pg.start()

    hook, done = once_past(system, 0.3, restart)
    run_until_settled(system, 600, hook)
    stop.set()
    feeder.join(15)
    stored = {r[0] for r in system.sql("SELECT producer_id FROM digest_events WHERE user_id = 'ingest'")}
    lost_events = len(set(accepted) - stored)
    report = tally(system, "postgres restart", started, f"(ingest: {statuses}; 202-then-lost {lost_events})")
    report.lost += lost_events
    report.duplicates += sum(n for code, n in statuses.items() if isinstance(code, int) and code >= 500 and code != 503)
    report.faults = int(done[0]) * statuses.get(503, 0)  # the restart happened and the API saw it
    return report


def newsletter_only(system: System, scale: float) -> None:
    system.start("web")
    system.wait_web()
    system.start_newsletter(int(20000 * scale))


def digests_only(system: System, scale: float) -> None:
    system.seed_digests(int(5000 * scale))


def postgres_away(system: System):
    """Postgres stopped for the pace's outage_seconds (12 s in the full drill) mid-send: longer than a
    write is retried by a worker that may give up, shorter than a claim's timeout. A live worker
    starts no mail it cannot record and keeps what the relay accepted until Postgres is back
    (app/platform/holds.py); nothing may arrive twice, under any Message-ID."""

    def fault():
        system.pg.stop("fast")
        time.sleep(system.pace.outage_seconds)
        system.pg.start()

    return fault


def drill_postgres_outage_newsletter(system: System, scale: float) -> Report:
    name = f"pg {system.pace.outage_seconds:g}s: newsletter"
    return one_fault(system, scale, name, 0.3, postgres_away(system), load=newsletter_only)


def drill_postgres_outage_digests(system: System, scale: float) -> Report:
    name = f"pg {system.pace.outage_seconds:g}s: digests"
    return one_fault(system, scale, name, 0.3, postgres_away(system), load=digests_only)


def drill_smtp_faults(system: System, scale: float) -> Report:
    window = system.pace.fault_seconds

    def bad_relay():
        # 451 to everything for a window (10 s in the full drill), then every other connection cut
        # mid-DATA for another: bounded windows, as a relay's bad minute is. Retries with backoff must
        # outlast them: five attempts span 15x DIGEST_RETRY_BASE_SECONDS (45 s in the full drill;
        # production: 60 s base, 15 min).
        system.sink.tempfail_until = time.monotonic() + window
        system.sink.drop_until = time.monotonic() + 2 * window

    return one_fault(system, scale, "smtp 451 + drops", 0.2, bad_relay)


def drill_two_of_each(system: System, scale: float) -> Report:
    start_load(system, scale)
    for name in ("scheduler", "scheduler", "worker", "worker"):
        system.start(name)
    started = time.monotonic()
    run_until_settled(system, 600)
    report = tally(system, "2 schedulers+pools", started)
    report.faults = 1
    return report


def drill_kill_scheduler_planning(system: System, scale: float) -> Report:
    n = int(200_000 * scale)
    system.sql(
        "INSERT INTO subscribers (user_id, email) SELECT 'p' || g, 'p' || g || '@example.test' "
        "FROM generate_series(1, %s) g",
        (n,),
    )
    system.env["DIGEST_PLAN_BATCH"] = str(max(100, n // 20))
    # The last subscriber's row is held locked (the planner skips it and leaves it for a later tick),
    # so planning cannot be complete when the kill lands, however fast it is at a small scale; at
    # full scale the kill lands between plan batches.
    blocker = psycopg2.connect(system.pg.url)
    blocker.cursor().execute("SELECT 1 FROM subscribers WHERE user_id = %s FOR UPDATE", (f"p{n}",))
    started = time.monotonic()
    scheduler = system.start("scheduler")
    while not system.sql("SELECT count(*) FROM digest_runs")[0][0]:
        time.sleep(0.05)
    system.kill(scheduler)  # mid-planning
    killed_at = system.sql("SELECT count(*) FROM digest_runs")[0][0]
    blocker.close()  # rolls back: the row is free again
    system.start("scheduler")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        planned, distinct = system.sql("SELECT count(*), count(DISTINCT subscriber_id) FROM digest_runs")[0]
        if planned >= n:
            break
        time.sleep(0.5)
    unplanned = system.sql("SELECT count(*) FROM subscribers WHERE digest_planned_until IS NULL")[0][0]
    return Report(
        "kill -9 scheduler",
        planned,
        n,
        planned - distinct,
        n - distinct,
        0,
        time.monotonic() - started,
        f"(killed after {killed_at:,} runs planned; unplanned {unplanned})",
        faults=int(killed_at < n),
    )


INGEST_EVENTS_PER_SECOND = 2000
INGEST_BATCH = 200


class Ingest(threading.Thread):
    """Posts events for the digest subscribers d0..d(n-1) over the API at `rate` events/s, in batches
    of INGEST_BATCH, until stopped. Counts what the API accepted (a 2xx means committed)."""

    def __init__(self, system: System, n: int, rate: float):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{system.web_port}/v1/events"
        self.headers = {"Authorization": f"Bearer {system.api_key('events')}"}
        self.n, self.rate = n, rate
        self.stop = threading.Event()
        self.accepted = self.refused = 0
        self.seconds = 0.0

    def run(self) -> None:
        started, sent, seq = time.monotonic(), 0, itertools.count()
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
                batch = []
                for _ in range(INGEST_BATCH):
                    i = next(seq)
                    batch.append(
                        {
                            "id": f"live-{i}",
                            "user_id": f"d{(i * 7919) % self.n}",
                            "category": "comment",
                            "entity_type": "post",
                            "entity_id": f"live{i % 50}",
                            "actor_id": f"b{i % 13}",
                            "actor_name": f"Live {i % 13}",
                            "payload": {"title": "Live post", "url": "https://example.test/live"},
                        }
                    )
                try:
                    r = client.post(self.url, headers=self.headers, json={"events": batch})
                    if r.status_code == 202:
                        self.accepted += r.json()["accepted"]
                    else:
                        self.refused += len(batch)
                except httpx.HTTPError:
                    self.refused += len(batch)  # not committed as far as we know: retried by nobody
                sent += len(batch)
        self.seconds = time.monotonic() - started


def drill_ingest_during_wave(system: System, scale: float) -> Report:
    """Events arrive steadily over the API (2,000/s at full scale) while a wave of 50,000 x scale
    digests goes out, and a worker is SIGKILLed mid-wave; then one more digest per subscriber takes
    what arrived after their first. Every event must be in exactly one sent digest (digest/marks.py:
    an event committed while its subscriber's digest was built is in that one or the next), every
    sent run's mail delivered, none under two Message-IDs."""
    n = max(100, int(50_000 * scale))
    system.start("web")
    system.wait_web()
    system.seed_digests(n)
    ingest = Ingest(system, n, max(200.0, INGEST_EVENTS_PER_SECOND * min(1.0, scale * 4)))
    system.start("scheduler")
    worker = system.start("worker")
    system.start("worker")
    started, kills = time.monotonic(), [0]
    ingest.start()

    def delivered() -> int:
        return len(system.sink.deliveries)  # resent mail counts too: only a trigger

    def kill_mid_wave():
        nonlocal worker
        if not kills[0] and delivered() > n // 2:
            system.kill(worker)
            kills[0] += 1
            worker = system.start("worker")
        if delivered() >= n:
            ingest.stop.set()

    first_wave = run_until_settled(system, 900, kill_mid_wave, poll=0.05)
    ingest.stop.set()
    ingest.join()
    # The second wave: every subscriber's next digest, due now, takes what arrived after the first.
    system.sql(
        "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for) SELECT id, 'daily', "
        "current_date + 1, now() FROM subscribers WHERE user_id LIKE 'd%%'"
    )
    second_wave = run_until_settled(system, 900, poll=0.2)
    with system.sink.lock:
        deliveries = list(system.sink.deliveries)
    # Mail: each sent run's Message-ID delivered; a run under two Message-IDs is a duplicate.
    sent_runs = {r for (r,) in system.sql("SELECT id FROM digest_runs WHERE status = 'sent'")}
    mids_of: dict[int, set[str]] = {}
    resent, seen = 0, set()
    for _, rcpt, mid in deliveries:
        resent += (rcpt, mid) in seen
        seen.add((rcpt, mid))
        run_id = int(mid.strip("<>").split(".", 1)[0].rsplit("-", 1)[1])
        mids_of.setdefault(run_id, set()).add(mid)
    mail_duplicates = sum(len(m) - 1 for m in mids_of.values()) + len(set(mids_of) - sent_runs)
    mail_lost = len(sent_runs - set(mids_of))
    # Events: each covered by exactly one sent run.
    covering = system.sql(COVERING_RUNS.format(where="true"))
    statuses = dict(system.sql("SELECT id, status FROM digest_runs"))
    sent_cover = [[r for r in runs if statuses.get(r) == "sent"] for _, runs in covering]
    events_lost = sum(1 for runs in sent_cover if not runs)
    events_twice = sum(1 for runs in sent_cover if len(runs) > 1)
    stored_live = system.sql("SELECT count(*) FROM digest_events WHERE producer_id LIKE 'live-%%'")[0][0]
    times = [started] + sorted(t for t, _, _ in deliveries)
    notes = (
        f"({len(covering):,} events, {stored_live:,} of them ingested during the wave at "
        f"{ingest.accepted / max(ingest.seconds, 1e-9):,.0f}/s, {ingest.refused} refused; events in no sent "
        f"digest {events_lost}, in two {events_twice}; {kills[0]} kill{resent_per_thread(resent, kills[0])})"
        + ("" if first_wave and second_wave else " TIMED OUT")
    )
    report = Report(
        "ingest during wave",
        len(mids_of),
        len(sent_runs),
        mail_duplicates + events_twice,
        mail_lost + events_lost + (ingest.accepted - stored_live),
        resent,
        max((b - a for a, b in itertools.pairwise(times)), default=0.0),
        notes,
        faults=kills[0],
    )
    return report


# -- held mail released (issue 40) ----------------------------------------------------------------
HOLD_RELEASE_SUBSCRIBERS = 20_000  # at scale 1
RELEASE_KILL_SHARE = 0.2  # a worker is SIGKILLed once this share of the release was delivered
EARLY_TOLERANCE_SECONDS = 0.2  # the sink's clock and the workers' (one machine) read a little apart


def drill_hold_release(system: System, scale: float) -> Report:
    """20,000 x scale `immediately` subscribers (UTC) with send-now mail due now, all inside quiet
    hours that began an hour ago and end at the first whole minute at least the pace's hold_seconds
    ahead (a window is HH:MM: the clock the workers' claims read is the real one). Two workers claim
    the runs and hold them (digest/claim.py); at the window's end the scheduler's checker makes them
    due again, and once a fifth of the release was delivered one worker is SIGKILLed (a fresh one
    started). Judged: exactly one mail per subscriber (one Message-ID: a re-send after the kill under
    the same one is the allowed case), nothing lost, nothing delivered before the window ended, every
    run held before it ended and sent with held_at kept, and every event in exactly one sent run."""
    n = max(100, int(HOLD_RELEASE_SUBSCRIBERS * scale))
    now = datetime.now(UTC)
    end = (now + timedelta(seconds=system.pace.hold_seconds + 59)).replace(second=0, microsecond=0)
    window = f"{now - timedelta(hours=1):%H:%M}-{end:%H:%M}"
    end_at = time.monotonic() + (end - datetime.now(UTC)).total_seconds()  # the sink's clock
    system.sql(
        "INSERT INTO subscribers (user_id, email, name, digest_cadence, timezone, quiet_hours, digest_planned_until) "
        "SELECT 'd' || g, 'd' || g || '@example.test', 'D ' || g, 'immediately', 'UTC', %s, now() + interval '1 day' "
        "FROM generate_series(0, %s) g",
        (window, n - 1),
    )
    system.sql(
        "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
        "actor_id, actor_name, payload) SELECT 'drill', 'e' || g || '-' || k, 'd' || g, 'comment', 'post', "
        "'p' || k, 'a' || k, 'Actor ' || k, '{\"title\": \"Post\", \"url\": \"https://example.test/p\"}' "
        "FROM generate_series(0, %s) g, generate_series(1, 3) k",
        (n - 1,),
    )
    system.sql(  # the send-now pass's runs (digest/immediate.py), due now: inside the window
        "INSERT INTO digest_runs (subscriber_id, cadence, period, slot, scheduled_for) "
        "SELECT id, 'immediately', current_date, 0, now() FROM subscribers WHERE user_id LIKE 'd%%'"
    )
    system.start("scheduler")
    worker = system.start("worker")
    system.start("worker")
    held = 0
    while time.monotonic() < end_at - 1:  # the workers claim the runs and hold them
        held = system.sql("SELECT count(*) FROM digest_runs WHERE held_at IS NOT NULL")[0][0]
        if held >= n:
            break
        time.sleep(0.2)
    held_before_end = held
    time.sleep(max(0.0, end_at - time.monotonic()))
    kills = [0]

    def kill_mid_release():
        nonlocal worker
        if not kills[0] and len(system.sink.deliveries) >= max(1, int(n * RELEASE_KILL_SHARE)):
            system.kill(worker)
            kills[0] += 1
            worker = system.start("worker")

    settled = run_until_settled(system, 900, kill_mid_release, poll=0.05)
    report = tally(system, "hold release", end_at)
    with system.sink.lock:
        times = [t for t, _, _ in system.sink.deliveries]
    early = sum(1 for t in times if t < end_at - EARLY_TOLERANCE_SECONDS)
    released_in = max(times, default=end_at) - end_at
    ((runs, sent, sent_held, subscribers_with_runs),) = system.sql(
        "SELECT count(*), count(*) FILTER (WHERE status = 'sent'), "
        "count(*) FILTER (WHERE status = 'sent' AND held_at IS NOT NULL), count(DISTINCT subscriber_id) "
        "FROM digest_runs"
    )
    covering = system.sql(COVERING_RUNS.format(where="true"))
    statuses = dict(system.sql("SELECT id, status FROM digest_runs"))
    sent_cover = [[r for r in ids if statuses.get(r) == "sent"] for _, ids in covering]
    events_lost = sum(1 for ids in sent_cover if not ids)
    events_twice = sum(1 for ids in sent_cover if len(ids) > 1)
    checks = []
    if held_before_end < n:
        checks.append(f"only {held_before_end:,} of {n:,} runs held before the window ended")
    if early:
        checks.append(f"{early} mail(s) delivered before the window ended")
    if runs != n or subscribers_with_runs != n or sent != n or sent_held != n:
        checks.append(f"runs {runs:,} ({subscribers_with_runs:,} subscribers), {sent:,} sent, {sent_held:,} held")
    if events_lost or events_twice:
        checks.append(f"events in no sent run {events_lost}, in two {events_twice}")
    if not settled:
        checks.append("TIMED OUT")
    report.failed_checks = checks
    report.faults = kills[0]
    report.notes = (
        f"({n:,} subscribers held by quiet hours {window} UTC, {held_before_end:,} held before the end; "
        f"released in {released_in:.1f} s from the window's end; {len(covering):,} events; "
        f"{kills[0]} kill mid-release{resent_per_thread(report.resent_after_kill, kills[0])})"
    )
    return report


# -- provider failover (issue 38) ------------------------------------------------------------------
FAILOVER_ORDER = ("postmark", "ses")  # MAIL_PROVIDERS: primary, secondary (issue 38's example)
SWITCH_WITHIN_SECONDS = 5.0  # the primary's first 503 -> the secondary's first acceptance
OUTAGE_AFTER_SHARE = 0.1  # the outage starts once the primary took this share of the newsletter


def drill_provider_failover(system: System, scale: float) -> Report:
    """A newsletter to 20,000 x scale recipients with MAIL_PROVIDERS=postmark,ses, both real local
    HTTP fakes; once the primary took a tenth of it, it answers 503 for the pace's outage (30 s in the
    full drill), then recovers. Checked against the outbox: every recipient's mail accepted exactly
    once across the two fakes, and each sent row records the provider that accepted it. Judged: the
    secondary accepted mail within SWITCH_WITHIN_SECONDS of the primary's first 503 (both by the
    fakes' clock; printed but not judged at a pace with judge_timing off), and the primary accepted
    mail again after its outage ended (the breaker's half-open probe, PROVIDER_BREAKER_COOLDOWN_SECONDS
    after it opened).

    The send is held to a rate (PROVIDER_RATE_PER_SECOND) at which what is left after the outage
    starts takes about twice the outage plus the cool-down: the newsletter is still going when the
    primary is back, however fast or slow the machine (a slow one only sends slower than the rate)."""
    pace = system.pace
    n = max(100, int(20_000 * scale))
    outage, cooldown = pace.provider_outage_seconds, pace.breaker_cooldown_seconds
    rate = max(5.0, (1 - OUTAGE_AFTER_SHARE) * n / (2 * (outage + cooldown)))
    primary: FakeAPI = FakePostmark(record=False)
    secondary: FakeAPI = FakeSES(record=False)
    fakes = {FAILOVER_ORDER[0]: primary, FAILOVER_ORDER[1]: secondary}
    with primary, secondary:
        system.env.update(
            {
                "MAIL_PROVIDERS": ",".join(FAILOVER_ORDER),
                **settings_for(primary),
                **settings_for(secondary),
                "PROVIDER_BREAKER_COOLDOWN_SECONDS": f"{cooldown:g}",
                "PROVIDER_RATE_PER_SECOND": f"{rate:.1f}",
            }
        )
        system.start("web")
        system.wait_web()
        system.start_newsletter(n)
        system.start("scheduler")
        system.start("worker")
        started = time.monotonic()
        outage_until: float | None = None
        deadline = started + 600 + 3 * (outage + cooldown)
        settled = False
        while time.monotonic() < deadline:
            with primary.lock:
                taken = sum(primary.accepted.values())
            if outage_until is None and taken >= OUTAGE_AFTER_SHARE * n:
                outage_until = primary.fail_for(outage)
            if system.settled() and len(primary.accepted) + len(secondary.accepted) >= n:
                settled = True
                break
            time.sleep(0.05)
        time.sleep(0.5)  # answers still on their way back are logged by now
        return _failover_report(system, n, fakes, outage_until, started, settled, rate)


def _failover_report(
    system: System,
    n: int,
    fakes: dict[str, FakeAPI],
    outage_until: float | None,
    started: float,
    settled: bool,
    rate: float,
) -> Report:
    primary, secondary = fakes[FAILOVER_ORDER[0]], fakes[FAILOVER_ORDER[1]]
    expected = {r[0] for r in system.sql("SELECT email FROM subscribers WHERE user_id LIKE 'n%%'")}
    got = {name: fake.recipients() for name, fake in fakes.items()}
    per_recipient: dict[str, int] = {}
    for counts in got.values():
        for rcpt, k in counts.items():
            per_recipient[rcpt] = per_recipient.get(rcpt, 0) + k
    duplicates = sum(k - 1 for k in per_recipient.values()) + len(set(per_recipient) - expected)
    lost = len(expected - set(per_recipient))
    # The outbox: every row sent, under the provider whose fake accepted its mail.
    rows = system.sql("SELECT email, status, provider FROM email_log")
    not_sent = sum(1 for _, status, _ in rows if status != "sent")
    misrecorded = sum(1 for email, status, provider in rows if status == "sent" and email not in got.get(provider, {}))
    first_503 = primary.first_answer(503)
    switched = secondary.first_answer(accepted=True, after=first_503) if first_503 is not None else None
    switch = None if switched is None or first_503 is None else switched - first_503
    back = primary.first_answer(accepted=True, after=outage_until) if outage_until is not None else None
    times = [started] + sorted(at for fake in fakes.values() for at, _, k in fake.answers if k)
    stall = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    checks = []
    if first_503 is None:
        checks.append("the primary never answered 503")
    elif switch is None:
        checks.append("the secondary took no mail after the primary's first 503")
    elif switch > SWITCH_WITHIN_SECONDS and system.pace.judge_timing:
        checks.append(f"switch after {switch:.1f} s (> {SWITCH_WITHIN_SECONDS:g} s)")
    if outage_until is not None and back is None:
        checks.append("no mail went back to the primary after it recovered")
    if not_sent or misrecorded:
        checks.append(f"outbox: {not_sent} rows not sent, {misrecorded} recorded under another provider")
    if not settled:
        checks.append("TIMED OUT")
    window = f"{system.pace.provider_outage_seconds:g}"
    notes = (
        f"(primary {FAILOVER_ORDER[0]} 503 for {window} s: {primary.status_counts.get(503, 0):,} calls answered 503; "
        f"switch {'-' if switch is None else f'{switch:.2f} s'}"
        f"{'' if system.pace.judge_timing else ' (not judged at this pace)'}; "
        f"back to the primary {'-' if back is None or outage_until is None else f'{back - outage_until:.1f} s'} "
        f"after it recovered; mails by provider {', '.join(f'{k} {sum(v.values()):,}' for k, v in got.items())}; "
        f"held to {rate:,.0f}/s)"
    )
    return Report(
        "provider failover",
        len(set(per_recipient) & expected),
        len(expected),
        duplicates,
        lost,
        0,
        stall,
        notes,
        faults=int(first_503 is not None),
        failed_checks=checks,
    )


# The drills that SIGKILL a worker: the only ones where a mail may arrive twice under one Message-ID.
KILL_WORKERS = frozenset({"kill_worker", "ingest_during_wave", "hold_release"})

DRILLS = {
    "kill_worker": drill_kill_worker,
    "redis_flush": drill_redis_flush,
    "postgres_restart": drill_postgres_restart,
    "postgres_outage_newsletter": drill_postgres_outage_newsletter,
    "postgres_outage_digests": drill_postgres_outage_digests,
    "smtp_faults": drill_smtp_faults,
    "two_of_each": drill_two_of_each,
    "kill_scheduler": drill_kill_scheduler_planning,
    "ingest_during_wave": drill_ingest_during_wave,
    "provider_failover": drill_provider_failover,
    "hold_release": drill_hold_release,
}


def run(names: list[str], scale: float, delay_ms: float = 0.0, pace: Pace = FULL) -> list[Report]:
    reports = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"drill-{name}-") as tmp, System(Path(tmp), pace) as system:
            system.sink.delay = delay_ms / 1000
            report = DRILLS[name](system, scale)
            print(report.line(), flush=True)
            reports.append(report)
    return reports


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="1.0 = 20k newsletter + 5k digests, 200k to plan")
    p.add_argument("--only", default=",".join(DRILLS), help="comma separated: " + ", ".join(DRILLS))
    p.add_argument("--delay-ms", type=float, default=20.0, help="the sink's reply delay per message")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(DRILLS)
    if unknown:
        p.error(f"unknown drills: {sorted(unknown)}")
    reports = run(names, args.scale, args.delay_ms)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
