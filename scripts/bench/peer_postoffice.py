"""A peer in the benchmark: django-post-office against our newsletter path, the same N personalised
~1 KB mails (HTML + text) over SMTP to the same kind of counting loopback sink, in one run.

    .venv/bin/python scripts/bench/peer_postoffice.py                     # 20,000 mails
    .venv/bin/python scripts/bench/peer_postoffice.py --recipients 2000 --smtp-delay-ms 50

peer  django-post-office 3.x + Django in their own venv (.var/bench/postoffice-venv: created with
      `python -m venv` and pip on the first run, reused after), a minimal Django project generated
      into a temp dir (database notify_bench_postoffice, EMAIL_BACKEND smtp to the sink,
      POST_OFFICE BATCH_SIZE 1000 and THREADS_PER_PROCESS 5). The N mails are queued beforehand with
      post_office.mail.send_many (rendered there, outside the window), with per-recipient
      List-Unsubscribe headers like ours; then `manage.py send_queued_mail --processes 2` is timed.
ours  the public API (POST /v1/newsletters, then /send to audience "all" of N seeded subscribers)
      with the Procfile worker (`dramatiq actors`, 2 processes, the Procfile's default threads),
      MAIL_PROVIDER=smtp to the sink, every other setting at its default (tracking on, List-Unsubscribe
      on); database notify_bench_peer_ours, Redis db 10. The window includes building the outbox.

Figures, for each: mails/s = N / (start -> the sink has received the N-th message; the start is
send_queued_mail being launched, resp. the send request); CPU seconds per mail over start -> job
finished (send_queued_mail exited, resp. the newsletter is `done`), split into
  app       peer: the send_queued_mail process and its forked pool processes, whole lifetime (rusage
            of the reaped tree, Django start-up included); ours: the web process and the dramatiq
            parent + worker processes, /proc utime+stime over the window
  postgres  the server's processes over the window: live ones from /proc, exited backends through the
            postmaster's cutime+cstime, minus backends of other databases (see shared.PostgresCPU)
  sink      the SMTP sink process over the window
  redis     ours only: the whole redis-server process over the window (the broker; a shared server,
            so other users' commands would count against ours)
and bytes per mail received by the sink (message = the DATA payload; wire = everything the client
sent, SMTP commands included); ours also logs the SMTP connections the sink saw and the most open
at once (what the worker processes' pools held). Target: ours >= 2x the peer's mails/s at default settings.
Everything on 127.0.0.1; every wait bounded (--timeout per phase).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PEER_REQUIREMENTS = ["django-post-office>=3,<4", "psycopg2-binary"]
PEER_BATCH_SIZE = 1000
PEER_THREADS = 5
PEER_PROCESSES = 2
SUBJECT = "Weekly letter for {{name}}"
LOG_DIR = ROOT / ".var" / "bench"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipients", type=int, default=20_000)
    p.add_argument("--smtp-delay-ms", type=float, default=0.0, help="the sink's delay before each 250 to DATA")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per phase")
    p.add_argument("--peer-database-url", default="postgresql://127.0.0.1/notify_bench_postoffice")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_peer_ours")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    p.add_argument(
        "--venv",
        default=str(ROOT / ".var" / "bench" / "postoffice-venv"),
        help="the peer's own venv (created if missing, reused otherwise)",
    )
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument(
        "--worker-processes",
        type=int,
        default=2,
        help="ours: WORKER_PROCESSES of the Procfile worker (the peer keeps --processes 2)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="ours: a setting other than its default (scripts/bench/knobs.py sweeps them)",
    )
    p.add_argument("--label", default="", help="names this run in the report (BENCH_RESULTS)")
    p.add_argument(
        "--respect-quiet-hours", action="store_true", help="ours: send with respect_quiet_hours (quiet_budget.py)"
    )
    args = p.parse_args()
    for item in args.set:
        if "=" not in item:
            p.error(f"--set {item!r}: expected NAME=VALUE")
    for url in (args.peer_database_url, args.database_url, args.redis_url):
        if urlparse(url).hostname not in ("127.0.0.1", "localhost"):
            p.error("the benchmark runs against loopback services only")
    if urlparse(args.redis_url).path.strip("/") in ("", "0"):
        p.error("the benchmark flushes its Redis db: give it its own (not db 0)")
    for url in (args.peer_database_url, args.database_url):
        if urlparse(url).path.strip("/") in ("notify", "notify_test", "postgres", ""):
            p.error("the benchmark empties its databases: give each its own")
    if args.recipients < 1:
        p.error("--recipients must be at least 1")
    return args


ARGS = parse_args()

from scripts.bench.loadgen import free_port, start_server  # noqa: E402
from scripts.bench.shared import (  # noqa: E402
    HTML,
    TEXT,
    PostgresCPU,
    cpu_delta,
    cpu_seconds,
    group_cpu,
    peak_rss_mb,
    procfile_command,
    record,
    seed_subscribers,
    stop_group,
    wait_heartbeats,
)

SINK_PORT = free_port()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], timeout: float, what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what}: no answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


# -- the counting sink (scripts/bench/smtp_sink.py), one per phase


class Sink:
    def __init__(self, expect: int):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "scripts/bench/smtp_sink.py"),
                "--port",
                str(SINK_PORT),
                "--delay-ms",
                str(ARGS.smtp_delay_ms),
                "--expect",
                str(expect),
            ],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.buf = b""
        self.reached_at: float | None = None
        self.stats: dict | None = None
        line = self.line(time.monotonic() + 30)
        if line != "ready":
            self.stop()
            raise SystemExit(f"sink did not start: {line!r}")

    def line(self, deadline: float) -> str | None:
        """The next line the sink prints, or None at the deadline / end of output."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        text = line.decode().strip()
        if text.startswith("reached "):
            self.reached_at = float(text.split()[2])
        elif text.startswith("stats "):
            self.stats = json.loads(text[6:])
        return text

    def wait_reached(self, deadline: float, progress=None) -> bool:
        """Until the sink has received the expected count (True) or the deadline (False); asks for
        its counters every 15 s and hands them to `progress`."""
        next_report = time.monotonic() + 15
        while self.reached_at is None:
            now = time.monotonic()
            if now >= deadline or self.proc.poll() is not None:
                return False
            if now >= next_report:
                os.kill(self.proc.pid, signal.SIGUSR1)
                next_report = now + 15
            line = self.line(min(deadline, next_report))
            if line and line.startswith("stats ") and progress:
                progress(self.stats)
        return True

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while self.line(deadline) is not None:
            pass
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        return self.stats or {}


def pg_connect(url: str, dbname: str | None = None):
    import psycopg2

    parsed = urlparse(url)
    conn = psycopg2.connect(
        host=parsed.hostname,
        port=parsed.port or 5432,
        user=parsed.username or None,
        password=parsed.password or None,
        dbname=dbname or parsed.path.lstrip("/"),
        connect_timeout=10,
    )
    conn.autocommit = True
    return conn


def progress_logger(started: float):
    return lambda stats: log(f"  {time.monotonic() - started:5.0f}s  sink has {stats['received']:,}")


# -- the peer: django-post-office


def ensure_peer_venv() -> tuple[Path, str]:
    """The peer's venv, created on the first run; returns (its python, "post_office X on Django Y")."""
    venv = Path(ARGS.venv)
    python = venv / "bin" / "python"
    marker = venv / ".bench-requirements"
    wanted = "\n".join(PEER_REQUIREMENTS)
    if not (python.exists() and marker.exists() and marker.read_text() == wanted):
        log(f"installing {', '.join(PEER_REQUIREMENTS)} into {venv}")
        if not python.exists():
            run([sys.executable, "-m", "venv", str(venv)], 300, "python -m venv")
        run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PEER_REQUIREMENTS],
            900,
            "pip install",
        )
        marker.write_text(wanted)
    versions = run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.version('django-post-office'), m.version('Django'))",
        ],
        60,
        "peer venv check",
    ).stdout.split()
    return python, f"django-post-office {versions[0]} on Django {versions[1]}"


SETTINGS = """\
SECRET_KEY = "bench-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = []
INSTALLED_APPS = ["django.contrib.contenttypes", "post_office"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": {name!r}, "HOST": {host!r},
                          "PORT": {port!r}, "USER": {user!r}}}}}
TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [], "APP_DIRS": False}}]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = "127.0.0.1"
EMAIL_PORT = {sink_port}
EMAIL_TIMEOUT = 30
DEFAULT_FROM_EMAIL = "Notify <notify@localhost>"
# Names as read by post_office/settings.py (get_batch_size, get_threads_per_process).
POST_OFFICE = {{"BATCH_SIZE": {batch}, "THREADS_PER_PROCESS": {threads}}}
"""

MANAGE = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
    from django.core.management import execute_from_command_line
    execute_from_command_line(sys.argv)
"""

# Queues N personalised mails with post_office.mail.send_many, 1,000 per call. Links and the
# List-Unsubscribe header have the shape and length of ours (base URL + /u/<43-character token>).
QUEUE = """\
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
import django

django.setup()
from post_office import mail

body = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "body.json")))
n = int(sys.argv[1])
for first in range(1, n + 1, 1000):
    batch = []
    for i in range(first, min(n, first + 999) + 1):
        token = hashlib.sha256(b"u%d" % i).hexdigest()[:43]
        unsubscribe = "http://localhost:8000/u/" + token
        batch.append({
            "recipients": ["User %d <user%d@example.com>" % (i, i)],
            "subject": body["subject"], "message": body["text"], "html_message": body["html"],
            "context": {"name": "User %d" % i, "email": "user%d@example.com" % i, "unsubscribe_url": unsubscribe,
                        "preferences_url": "http://localhost:8000/p/" + token},
            "headers": {"List-Unsubscribe": "<%s>" % unsubscribe,
                        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
        })
    mail.send_many(batch)
"""


def run_peer(n: int) -> dict:
    python, version = ensure_peer_venv()
    url = urlparse(ARGS.peer_database_url)
    name = url.path.lstrip("/")
    admin = pg_connect(ARGS.peer_database_url, dbname="postgres")
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    with tempfile.TemporaryDirectory(prefix="bench-postoffice-") as tmp:
        project = Path(tmp)
        (project / "benchsite").mkdir()
        (project / "benchsite" / "__init__.py").write_text("")
        (project / "benchsite" / "settings.py").write_text(
            SETTINGS.format(
                name=name,
                host=url.hostname,
                port=str(url.port or 5432),
                user=url.username or "root",
                sink_port=SINK_PORT,
                batch=PEER_BATCH_SIZE,
                threads=PEER_THREADS,
            )
        )
        (project / "manage.py").write_text(MANAGE)
        (project / "queue_mails.py").write_text(QUEUE)
        # Django's template language reads {{name}} as ours does; the same subject and bodies.
        (project / "body.json").write_text(json.dumps({"subject": SUBJECT, "html": HTML, "text": TEXT}))
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
        run([str(python), "manage.py", "migrate", "-v", "0"], 300, "peer migrate", cwd=project, env=env)

        started = time.monotonic()
        run([str(python), "queue_mails.py", str(n)], ARGS.timeout, "peer send_many", cwd=project, env=env)
        queue_seconds = time.monotonic() - started
        conn = pg_connect(ARGS.peer_database_url)
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM post_office_email WHERE status = 2")  # STATUS.queued
            queued = cur.fetchone()[0]
            cur.execute("VACUUM ANALYZE post_office_email")
        if queued != n:
            raise SystemExit(f"peer: {queued} mails queued, expected {n}")
        log(f"peer: {n:,} mails queued by send_many in {queue_seconds:.1f} s (outside the window)")

        sink = Sink(expect=n)
        postgres = PostgresCPU(conn, name)
        log_path = LOG_DIR / "peer-postoffice-send.log"
        try:
            sink_cpu0 = sink.cpu()
            postgres.start()
            children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            with open(log_path, "w") as out:
                sender = subprocess.Popen(
                    [
                        str(python),
                        "manage.py",
                        "send_queued_mail",
                        "--processes",
                        str(PEER_PROCESSES),
                        "--lockfile",
                        str(project / "send-lock"),
                    ],
                    cwd=project,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = started + ARGS.timeout
            reached = sink.wait_reached(deadline, progress_logger(started))
            try:
                sender.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_group(sender)
                raise SystemExit(
                    f"peer: send_queued_mail still running after {ARGS.timeout:.0f} s "
                    f"(sink has {sink.stop().get('received')}); log: {log_path}"
                ) from None
            finished = time.monotonic()
            children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            pg = postgres.stop()
            sink_cpu = sink.cpu() - sink_cpu0
        finally:
            stats = sink.stop()
        if sender.returncode != 0:
            raise SystemExit(f"peer: send_queued_mail exited {sender.returncode}; log: {log_path}")
        with conn.cursor() as cur:
            cur.execute("SELECT status, count(*) FROM post_office_email GROUP BY status")
            statuses = dict(cur.fetchall())
        conn.close()
    app_cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    ok = reached and statuses == {0: n} and stats.get("received") == n  # STATUS.sent == 0
    if not ok:
        log(f"peer: NOT all delivered exactly once: sink {stats}, post_office_email statuses {statuses}")
    return {
        "label": "post_office",
        "version": version,
        "queue_seconds": queue_seconds,
        "to_sink": (sink.reached_at or finished) - started,
        "to_done": finished - started,
        "cpu": {"app": app_cpu, "postgres": pg["seconds"], "sink": sink_cpu, "redis": 0.0},
        "others_active_ms": pg["others_active_ms"],
        "sink": stats,
        "ok": ok,
    }


# -- ours: the public API and the Procfile worker


def our_env() -> dict:
    """Every Settings variable at its default except where the run needs its own (databases, the
    SMTP sink, the dev secret key); WORKER_THREADS unset so the Procfile's default applies."""
    from dataclasses import fields

    from app.platform.config import Settings, env_name

    env = dict(os.environ)
    for f in fields(Settings):
        env.pop(env_name(f.name), None)
    for name in ("WORKER_THREADS", "WORKER_PROCESSES", "WORKER_SHUTDOWN_TIMEOUT_MS", "DRAMATIQ_PROCESSES"):
        env.pop(name, None)
    env.update(
        APP_ENV="development",
        DATABASE_URL=ARGS.database_url,
        REDIS_URL=ARGS.redis_url,
        MAIL_PROVIDER="smtp",
        SMTP_URL=f"smtp://127.0.0.1:{SINK_PORT}",
        LOG_LEVEL="WARNING",
        WORKER_PROCESSES=str(ARGS.worker_processes),
        PYTHONPATH=str(ROOT),
    )
    env.update(item.split("=", 1) for item in ARGS.set)
    return env


def api(port: int, key: str, method: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def run_ours(n: int) -> dict:
    env = our_env()
    os.environ.clear()  # this process reads the same settings as the web and worker processes
    os.environ.update(env)
    import redis

    from app.platform import apikeys, config, db, migrate

    config.reload()
    settings = config.get()
    migrate.migrate(ARGS.database_url)
    db.init(ARGS.database_url)
    seed_subscribers(n, log)
    key = apikeys.create("bench-peer", "admin")
    rclient = redis.Redis.from_url(ARGS.redis_url)
    rclient.flushdb()
    redis_pid = int(rclient.info("server")["process_id"])
    worker_cmd = procfile_command("worker", env)
    conn = pg_connect(ARGS.database_url)
    postgres = PostgresCPU(conn, urlparse(ARGS.database_url).path.lstrip("/"))
    port = free_port()
    worker_log = LOG_DIR / "peer-ours-worker.log"
    sink = Sink(expect=n)
    web = worker = None
    try:
        web = start_server("app.web:app", port, env)
        with open(worker_log, "w") as out:
            worker = subprocess.Popen(
                worker_cmd, cwd=ROOT, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
            )
        wait_heartbeats(ARGS.redis_url, ARGS.worker_processes, worker)
        newsletter_id = api(port, key, "POST", "/v1/newsletters", {"subject": SUBJECT, "html": HTML, "text": TEXT})[
            "id"
        ]

        workers0, web0, sink0, redis0 = group_cpu(worker.pid), cpu_seconds(web.pid), sink.cpu(), cpu_seconds(redis_pid)
        postgres.start()
        started = time.monotonic()
        send = {"audience": "all", **({"respect_quiet_hours": True} if ARGS.respect_quiet_hours else {})}
        api(port, key, "POST", f"/v1/newsletters/{newsletter_id}/send", send)
        deadline = started + ARGS.timeout
        reached = sink.wait_reached(deadline, progress_logger(started))
        status = None
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))
                status = cur.fetchone()[0]
                if status == "done":
                    break
                time.sleep(0.05)
        finished = time.monotonic()
        rss_mb, _ = peak_rss_mb(worker.pid)
        cpu = {
            "app": cpu_delta(workers0, group_cpu(worker.pid)) + cpu_seconds(web.pid) - web0,
            "postgres": 0.0,
            "sink": sink.cpu() - sink0,
            "redis": cpu_seconds(redis_pid) - redis0,
        }
        pg = postgres.stop()
        cpu["postgres"] = pg["seconds"]
    finally:
        if worker is not None:
            stop_group(worker)
        if web is not None:
            web.terminate()
            try:
                web.wait(timeout=20)
            except subprocess.TimeoutExpired:
                web.kill()
        stats = sink.stop()
    with conn.cursor() as cur:
        cur.execute("SELECT status, count(*) FROM email_log WHERE newsletter_id = %s GROUP BY status", (newsletter_id,))
        statuses = dict(cur.fetchall())
    conn.close()
    ok = reached and status == "done" and statuses == {"sent": n} and stats.get("received") == n
    log(
        f"ours: the sink saw {stats.get('connections', 0):,} SMTP connections, at most "
        f"{stats.get('peak_connections', 0):,} open at once"
    )
    if not ok:
        log(
            f"ours: NOT all delivered exactly once: newsletter {status}, rows {statuses}, sink {stats}; "
            f"worker log: {worker_log}"
        )
    threads = worker_cmd[worker_cmd.index("--threads") + 1] if "--threads" in worker_cmd else "?"
    return {
        "label": "ours",
        "to_sink": (sink.reached_at or finished) - started,
        "to_done": finished - started,
        "cpu": cpu,
        "others_active_ms": pg["others_active_ms"],
        "sink": stats,
        "ok": ok,
        "rss_mb": rss_mb,
        "describe": f"dramatiq actors --processes {ARGS.worker_processes} --threads {threads} (Procfile), "
        f"SEND_BATCH_SIZE {settings.send_batch_size}, SMTP_POOL_SIZE {settings.smtp_pool_size}, "
        f"NEWSLETTER_SEND_CHAINS {settings.newsletter_send_chains}, "
        f"tracking {'on' if settings.tracking else 'off'}, List-Unsubscribe on",
    }


# -- report


def record_results(results: dict, n: int) -> None:
    """The figures for BENCHMARKS.md (scripts/bench/report.py)."""
    delay = f"{ARGS.smtp_delay_ms:g} ms"
    label = ARGS.label or f"newsletter over SMTP, {n:,} mails, relay {delay}"
    o, p = results.get("ours"), results.get("peer")
    cpu_ms = {k: sum(r["cpu"].values()) / n * 1000 for k, r in results.items()}
    if o and p:
        speed = p["to_sink"] / o["to_sink"]
        record(
            label,
            "mails/s",
            n / o["to_sink"],
            "mails/s",
            baseline=n / p["to_sink"],
            baseline_label="django-post-office (peer)",
            target="ours >= 2x the peer",
            met=speed >= 2.0 and o["ok"] and p["ok"],
            delay_ms=ARGS.smtp_delay_ms,
            recipients=n,
            processes=ARGS.worker_processes,
            settings=ARGS.set,
        )
        record(
            label,
            "CPU per mail (app + postgres + sink + redis)",
            cpu_ms["ours"],
            "ms",
            baseline=cpu_ms["peer"],
            baseline_label="django-post-office (peer)",
            higher_is_better=False,
        )
        record(
            label,
            "bytes per mail (message)",
            o["sink"].get("message_bytes", 0) / n,
            "bytes",
            baseline=p["sink"].get("message_bytes", 0) / n,
            baseline_label="django-post-office (peer)",
            higher_is_better=False,
        )
    elif o:
        minutes = o["to_done"] / 60
        target = "1M recipients <= 15 min on 2 cores (stretch 10)" if n >= 1_000_000 else ""
        record(
            label,
            "mails/s",
            n / o["to_sink"],
            "mails/s",
            target=target,
            met=(minutes <= 15 and o["ok"]) if target else o["ok"],
            delay_ms=ARGS.smtp_delay_ms,
            recipients=n,
            processes=ARGS.worker_processes,
            settings=ARGS.set,
            cpu=o["cpu"],
        )
        record(
            label,
            "wall time, send request -> done",
            o["to_done"],
            "s",
            higher_is_better=False,
            target=target,
            met=(minutes <= 15 and o["ok"]) if target else None,
        )
        record(label, "worker peak RSS", o["rss_mb"], "MB", higher_is_better=False)
        record(label, "CPU per mail (app + postgres + sink + redis)", cpu_ms["ours"], "ms", higher_is_better=False)


def row(label: str, r: dict, n: int) -> str:
    c = {k: v / n * 1000 for k, v in r["cpu"].items()}
    total = sum(c.values())
    s = r["sink"]
    return (
        f"{label:<12}| {n / r['to_sink']:>8,.0f} | {r['to_sink']:>8.1f}s | {r['to_done']:>7.1f}s | "
        f"{c['app']:>6.2f} | {c['postgres']:>8.2f} | {c['sink']:>5.2f} | {c['redis']:>5.2f} | {total:>6.2f} | "
        f"{s.get('message_bytes', 0) / n:>7,.0f} | {s.get('wire_bytes', 0) / n:>6,.0f} | "
        f"{'yes' if r['ok'] else 'NO'}"
    )


def main() -> int:
    n = ARGS.recipients
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log(
        f"peer benchmark: {n:,} mails over SMTP, sink delay {ARGS.smtp_delay_ms:g} ms, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    results = {}
    if not ARGS.skip_peer:
        results["peer"] = run_peer(n)
        r = results["peer"]
        log(f"peer: {n / r['to_sink']:,.0f} mails/s ({r['to_sink']:.1f} s to the sink, {r['to_done']:.1f} s to exit)")
    if not ARGS.skip_ours:
        results["ours"] = run_ours(n)
        r = results["ours"]
        log(f"ours: {n / r['to_sink']:,.0f} mails/s ({r['to_sink']:.1f} s to the sink, {r['to_done']:.1f} s to done)")

    print()
    print(
        f"Peer benchmark: {n:,} personalised mails (~1 KB HTML + text) over SMTP to a loopback counting sink, "
        f"sink delay {ARGS.smtp_delay_ms:g} ms, {os.cpu_count()} cores, load average now "
        f"{os.getloadavg()[0]:.1f}"
    )
    if "peer" in results:
        p = results["peer"]
        print(
            f"  post_office: {p['version']}; manage.py send_queued_mail --processes {PEER_PROCESSES}, "
            f"BATCH_SIZE {PEER_BATCH_SIZE}, THREADS_PER_PROCESS {PEER_THREADS}; queued by send_many beforehand "
            f"({p['queue_seconds']:.1f} s, not in the figures)"
        )
    if "ours" in results:
        o = results["ours"]
        print(
            f"  ours: {o['describe']}; POST /v1/newsletters/{{id}}/send, outbox built in the window; "
            f"worker peak RSS {o['rss_mb']:.0f} MB (VmHWM, largest worker process)"
        )
    print(
        f"{'':<12}| {'mails/s':>8} | {'to sink':>9} | {'to done':>8} | CPU ms per mail: {'':>22}"
        "| bytes per mail:  | once"
    )
    print(
        f"{'':<12}| {'':>8} | {'':>9} | {'':>8} | {'app':>6} | {'postgres':>8} | {'sink':>5} | {'redis':>5} | "
        f"{'total':>6} | {'message':>7} | {'wire':>6} |"
    )
    for key, r in results.items():
        print(row("post_office" if key == "peer" else "ours", r, n))
    met = None
    if len(results) == 2:
        p, o = results["peer"], results["ours"]
        speed = p["to_sink"] / o["to_sink"]
        cpu_ratio = sum(o["cpu"].values()) / sum(p["cpu"].values())
        bytes_ratio = o["sink"].get("message_bytes", 0) / max(1, p["sink"].get("message_bytes", 0))
        print(
            f"{'ours/peer':<12}| {speed:>7.2f}x | {'':>9} | {p['to_done'] / o['to_done']:>6.2f}x | "
            f"{'':>6} | {'':>8} | {'':>5} | {'':>5} | {cpu_ratio:>5.2f}x | {bytes_ratio:>6.2f}x |"
        )
        met = speed >= 2.0 and p["ok"] and o["ok"]
        print(
            f"target: ours >= 2x the peer's mails/s at default settings: {'met' if met else 'NOT met'} "
            f"({speed:.2f}x; CPU per mail ours/peer {cpu_ratio:.2f}, lower is better)"
        )
    record_results(results, n)
    print(
        "mails/s = N / time to the sink's N-th message; 'to done' = until send_queued_mail exited / the newsletter "
        "is done, the CPU window (see the module docstring for what each CPU column counts)"
    )
    noisy = {k: r["others_active_ms"] for k, r in results.items() if r["others_active_ms"] > 0}
    if noisy:
        print(
            "note: other databases on the Postgres server were active during the window ("
            + ", ".join(f"{k}: {v / 1000:.1f} s" for k, v in noisy.items())
            + " of statement time); backends of theirs that came and went inside it count in the postgres column"
        )
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
