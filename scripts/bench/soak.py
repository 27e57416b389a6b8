"""A mixed soak: the Procfile's processes under steady, varied load for an hour, watching whether
worker memory plateaus (issue 26.5) and what the waves do to ingestion's latency.

    .venv/bin/python scripts/bench/soak.py                    # 60 minutes
    .venv/bin/python scripts/bench/soak.py --minutes 5        # a short look

The service as shipped — web and worker started from the Procfile's own lines (uvicorn, 2 processes;
`dramatiq actors`, 2 processes x 8 threads), scheduler — against its own database (notify_bench_soak)
and Redis db, mail over SMTP to scripts/bench/smtp_sink.py at 0 ms, tracking on. The load, all over
the service's own HTTP API:

  events      --events-per-second (1,000) to random subscribers, batches of 100 every 0.1 s; each
              request's latency is recorded (the ingest p50/p99 per interval)
  subscribers --subscribers (20,000): 90 % hourly, 10 % daily; on top of the scheduler's own
              planning, every --digest-every minutes (10) all subscribers with something unsent get
              their next digest now (`digest-now --all`): a wave of up to 20,000 digests
  newsletters one to everyone every --newsletter-every minutes (5)
  clicks      --clicks-per-second (50) on links the sent mails carry (codes from email_links)
  opens       the same rate on the open pixels
  webhooks    signed SendGrid event batches, --webhooks-per-second (200) events

Every --sample seconds (30) it reads each worker process's VmRSS (current, not peak) and prints a
line; at the end a table per 5 minutes, one per digest wave (its peak, and what the process kept
before the next), and the figures for BENCHMARKS.md: the peak of the first digest wave's cycle
against the last one's, and the first 10 minutes against the last 10 (a plateau: each time the
later no higher than the earlier plus 10 MB), the 160 MB target, and ingest p99 overall and during
waves.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Not this script's directory first: scripts/bench/click.py would stand in for the click package.
sys.path[0] = str(ROOT)

import httpx  # noqa: E402
import orjson  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from scripts.bench.loadgen import free_port  # noqa: E402
from scripts.bench.shared import group_pids, procfile_command, record, stop_group, wait_heartbeats  # noqa: E402

RSS_TARGET_MB = 160
PY = sys.executable


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--subscribers", type=int, default=20_000)
    p.add_argument("--events-per-second", type=float, default=1000.0)
    p.add_argument("--clicks-per-second", type=float, default=50.0)
    p.add_argument("--webhooks-per-second", type=float, default=200.0)
    p.add_argument("--newsletter-every", type=float, default=5.0, help="minutes")
    p.add_argument("--digest-every", type=float, default=10.0, help="minutes")
    p.add_argument("--sample", type=float, default=30.0, help="seconds between RSS samples")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_soak")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    args = p.parse_args()
    for url in (args.database_url, args.redis_url):
        if "127.0.0.1" not in url and "localhost" not in url:
            p.error("the soak runs against loopback services only")
    return args


ARGS = parse_args()
os.environ.setdefault("APP_ENV", "development")  # the same signing key as the service's processes

from tracking import codes  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Service:
    """The processes, their environment and the API keys."""

    def __init__(self):
        self.web_port, self.smtp_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.web_port}"
        self.webhook_key = ec.generate_private_key(ec.SECP256R1())
        public = base64.b64encode(
            self.webhook_key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).decode()
        self.env = {
            **os.environ,
            "APP_ENV": "development",
            "DATABASE_URL": ARGS.database_url,
            "REDIS_URL": ARGS.redis_url,
            "MAIL_PROVIDER": "smtp",
            "SMTP_URL": f"smtp://127.0.0.1:{self.smtp_port}",
            "BASE_URL": self.base,
            "TRACKING": "1",
            "SENDGRID_WEBHOOK_PUBLIC_KEY": public,
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def run(self, *argv: str) -> str:
        out = subprocess.run([PY, *argv], env=self.env, cwd=ROOT, check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log_file = open(f"/tmp/notify-soak-{name}.log", "w")  # noqa: SIM115 - the process writes to it
        proc = subprocess.Popen(
            argv, env=self.env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def up(self) -> None:
        import redis

        redis.Redis.from_url(ARGS.redis_url).flushdb()
        self.run("-m", "app", "migrate")  # creates the database on a fresh machine
        self.autovacuum_was = ensure_autovacuum()
        self.seed()
        self.admin = self.run("-m", "app", "create-api-key", "soak-admin", "--scope", "admin")
        self.events_key = self.run("-m", "app", "create-api-key", "soak-events", "--scope", "events")
        sink = subprocess.Popen(
            [PY, str(ROOT / "scripts/bench/smtp_sink.py"), "--port", str(self.smtp_port)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        sink.stdout.readline()  # listening
        self.procs["sink"] = sink
        # web and worker as the Procfile starts them (WEB_CONCURRENCY, WORKER_PROCESSES, … from the environment)
        procfile_env = {**self.env, "PORT": str(self.web_port)}
        self.start("web", procfile_command("web", procfile_env))
        self.start("worker", procfile_command("worker", procfile_env))
        self.start("scheduler", [PY, "-m", "app", "scheduler"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        wait_heartbeats(ARGS.redis_url, 2, self.procs["worker"])

    def seed(self) -> None:
        import psycopg2

        with psycopg2.connect(ARGS.database_url) as conn, conn.cursor() as cur:
            cur.execute(
                "TRUNCATE subscribers, digest_events, digest_runs, newsletters, email_log, email_links, "
                "email_link_history, webhook_events, digest_event_keys, webhook_event_keys, digest_marks "
                "RESTART IDENTITY CASCADE"
            )
            cur.execute(
                "INSERT INTO subscribers (user_id, email, canonical_email, name, digest_cadence) "
                "SELECT 's' || g, 's' || g || '@example.com', 's' || g || '@example.com', 'S ' || g, "
                "CASE WHEN g %% 10 = 0 THEN 'daily' ELSE 'hourly' END FROM generate_series(1, %s) g",
                (ARGS.subscribers,),
            )
        log(f"seeded {ARGS.subscribers:,} subscribers (90 % hourly)")

    def down(self) -> None:
        for proc in self.procs.values():
            stop_group(proc)
        self.procs.clear()
        if getattr(self, "autovacuum_was", "on") != "on":
            self.autovacuum_was = "on"
            server_setting("ALTER SYSTEM RESET autovacuum")
            log("autovacuum: back to the server's own setting (off)")

    def worker_rss(self) -> list[float]:
        """VmRSS (MB) of each worker process (not the dramatiq parent)."""
        pgid = self.procs["worker"].pid
        out = []
        for pid in group_pids(pgid):
            if pid == pgid:
                continue
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out.append(int(line.split()[1]) / 1024)
            except FileNotFoundError:
                pass
        return out


def server_setting(statement: str) -> None:
    import psycopg2

    conn = psycopg2.connect(ARGS.database_url)
    conn.autocommit = True  # ALTER SYSTEM refuses a transaction block (and `with conn` would open one)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


def ensure_autovacuum() -> str:
    """A production Postgres runs autovacuum; some CI machines' servers have it off
    (conf.d/90-ci.conf), and a soak without it measures a database whose event partitions are never
    analyzed (docs/operations.md "Postgres settings"). Turned on for the run (ALTER SYSTEM,
    reloaded), the server's own setting restored at the end."""
    import psycopg2

    with psycopg2.connect(ARGS.database_url) as conn, conn.cursor() as cur:
        cur.execute("SHOW autovacuum")
        was = cur.fetchone()[0]
    conn.close()
    if was != "on":
        server_setting("ALTER SYSTEM SET autovacuum = on")
        log("autovacuum was off on this server: on for the soak, as in production (restored at the end)")
    return was


class Paced(threading.Thread):
    """Calls `step()` `rate` times a second (each call may carry several units), until stopped."""

    def __init__(self, name: str, rate: float, step):
        super().__init__(name=name, daemon=True)
        self.rate, self.step = rate, step
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        started, n = time.monotonic(), 0
        while not self.stop.is_set():
            ahead = n / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            n += 1
            try:
                self.step()
            except Exception:
                self.errors += 1


def main() -> int:
    service = Service()
    atexit.register(service.down)  # a soak stopped early leaves no process behind, nor autovacuum changed
    service.up()
    events_h = {"Authorization": f"Bearer {service.events_key}"}
    admin_h = {"Authorization": f"Bearer {service.admin}"}
    client = httpx.Client(base_url=service.base, timeout=30)
    latencies: list[tuple[float, float]] = []  # (when, seconds) per ingest request
    seq = iter(range(10**12))
    rng = random.Random(26)

    def post_events() -> None:
        batch = [
            {
                "id": f"soak-{next(seq)}",
                "user_id": f"s{rng.randint(1, ARGS.subscribers)}",
                "category": rng.choice(("like", "comment", "mention")),
                "entity_type": "post",
                "entity_id": f"p{rng.randint(1, 500)}",
                "actor_id": f"a{rng.randint(1, 300)}",
                "actor_name": "Someone",
                "payload": {"title": "A post", "url": "https://example.com/p"},
            }
            for _ in range(100)
        ]
        started = time.perf_counter()
        r = client.post("/v1/events", json={"events": batch}, headers=events_h)
        latencies.append((time.monotonic(), time.perf_counter() - started))
        r.raise_for_status()

    links: list[tuple[int, str, int]] = []  # (link id, mail kind, mail id) of links sent mails carry

    def refresh_links() -> None:
        import psycopg2

        with psycopg2.connect(ARGS.database_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT id, mail_kind, mail_id FROM email_links ORDER BY id DESC LIMIT 2000")
            links[:] = cur.fetchall()

    def click() -> None:
        if not links:
            return
        link_id, kind, mail_id = rng.choice(links)
        sid = rng.randint(1, ARGS.subscribers)
        client.get(f"/c/{codes.click_code(link_id, sid)}", follow_redirects=False)
        client.get(f"/o/{codes.open_code(kind, mail_id, sid)}.gif")

    signer = service.webhook_key
    wh_seq = iter(range(10**12))

    def post_webhooks() -> None:
        ts = str(int(time.time()))
        batch = []
        for _ in range(100):
            i = next(wh_seq)
            batch.append(
                {
                    "email": f"s{rng.randint(1, ARGS.subscribers)}@example.com",
                    "timestamp": int(time.time()),
                    "event": rng.choice(("delivered", "open", "click", "processed")),
                    "sg_event_id": f"soak-{i}",
                    "sg_message_id": f"soak{i}.filter",
                    "mail_kind": "newsletter",
                    "mail_id": "1",
                    "row_id": str(i),
                    "subscriber_id": str(rng.randint(1, ARGS.subscribers)),
                }
            )
        body = orjson.dumps(batch)
        sig = base64.b64encode(signer.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))).decode()
        client.post(
            "/webhooks/sendgrid",
            content=body,
            headers={
                "Content-Type": "application/json",
                "X-Twilio-Email-Event-Webhook-Signature": sig,
                "X-Twilio-Email-Event-Webhook-Timestamp": ts,
            },
        ).raise_for_status()

    def newsletter() -> None:
        nl = client.post(
            "/v1/newsletters",
            headers=admin_h,
            json={
                "subject": "Soak news for {{name}}",
                "html": '<p>Hi {{name}}</p><a href="https://example.com/a">read</a> '
                '<a href="https://example.com/b">more</a> <a href="{{unsubscribe_url}}">unsubscribe</a>',
            },
        ).json()["id"]
        client.post(f"/v1/newsletters/{nl}/send", headers=admin_h, json={"audience": "all"}).raise_for_status()

    threads = [
        Paced("events", ARGS.events_per_second / 100, post_events),
        Paced("clicks", ARGS.clicks_per_second, click),
        Paced("webhooks", ARGS.webhooks_per_second / 100, post_webhooks),
    ]
    for t in threads:
        t.start()
    started = time.monotonic()
    end = started + ARGS.minutes * 60
    next_newsletter = next_digest = started
    next_sample = started
    waves: list[tuple[float, float]] = []  # (start, end) of each digest-now wave's first minutes
    samples: list[tuple[float, list[float]]] = []
    stop = {"now": False}
    for sig in (signal.SIGINT, signal.SIGTERM):  # stopped early: the summary of what ran, then down()
        signal.signal(sig, lambda *_: stop.update(now=True))
    while time.monotonic() < end and not stop["now"]:
        now = time.monotonic()
        if now >= next_newsletter:
            newsletter()
            next_newsletter += ARGS.newsletter_every * 60
        if now >= next_digest:
            service.run("-m", "app", "digest-now", "--all")
            waves.append((now, now + 120))
            next_digest += ARGS.digest_every * 60
        if now >= next_sample:
            refresh_links()
            rss = service.worker_rss()
            samples.append((now - started, rss))
            recent = [s for w, s in latencies if w > now - ARGS.sample]
            p99 = statistics.quantiles(recent, n=100)[98] * 1e3 if len(recent) >= 100 else float("nan")
            log(
                f"{(now - started) / 60:5.1f} min  worker RSS {' / '.join(f'{r:.0f}' for r in rss)} MB  "
                f"ingest p99 {p99:.0f} ms ({len(recent)} requests)  errors {[t.errors for t in threads]}"
            )
            next_sample += ARGS.sample
        time.sleep(0.5)
    for t in threads:
        t.stop.set()
    for t in threads:
        t.join(timeout=30)
    service.down()
    import psycopg2

    with psycopg2.connect(ARGS.database_url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT (SELECT count(*) FROM digest_events), "
            "(SELECT count(*) FROM digest_runs WHERE status = 'sent'), "
            "(SELECT count(*) FROM email_log WHERE status = 'sent'), "
            "(SELECT count(*) FROM email_link_history), (SELECT count(*) FROM webhook_events)"
        )
        events, digests, mails, clicks, webhooks = cur.fetchone()
    log(
        f"done: {events:,} events stored, {digests:,} digests and {mails:,} newsletter mails sent, "
        f"{clicks:,} clicks and opens recorded, {webhooks:,} webhook events stored"
    )
    return report(samples, latencies, waves, started, [t.errors for t in threads])


def report(samples, latencies, waves, started, errors) -> int:
    def p99(values: list[float]) -> float:
        return statistics.quantiles(values, n=100)[98] * 1e3 if len(values) >= 100 else float("nan")

    print(f"\nsoak, {ARGS.minutes:g} minutes, {ARGS.subscribers:,} subscribers, 2 cores")
    print(f"{'minutes':>9} | {'worker RSS max MB':>17} | {'ingest p50 ms':>13} | {'ingest p99 ms':>13}")
    step = 5 * 60
    for k in range(int(ARGS.minutes * 60 // step) + 1):
        lo, hi = k * step, (k + 1) * step
        rss = [max(r) for t, r in samples if lo <= t < hi and r]
        lat = [s for w, s in latencies if lo <= w - started < hi]
        if not rss:  # the requests still in flight when the run ended
            continue
        p50 = statistics.median(lat) * 1e3 if lat else float("nan")
        print(f"{lo // 60:>3}-{hi // 60:<5} | {max(rss, default=0):>17.0f} | {p50:>13.0f} | {p99(lat):>13.0f}")
    # A plateau is judged wave against wave: each cycle runs from one digest wave to the next (the
    # wave at minute 0 carries nothing, events start with the run), so the first cycle holds the
    # same load as the last. Its peak is the wave's working set; the level before the next wave
    # is what the process kept.
    bounds = [a - started for a, _ in waves[1:]] + [ARGS.minutes * 60]
    cycles = []
    for lo, hi in itertools.pairwise(bounds):
        inside = [max(r) for t, r in samples if lo <= t < hi and r]
        if inside:
            cycles.append((lo, max(inside), inside[-1]))
    if cycles:
        print(f"\n{'digest wave at min':>18} | {'worker RSS peak MB':>18} | {'before the next wave MB':>23}")
        for lo, top, kept in cycles:
            print(f"{lo / 60:>18.0f} | {top:>18.0f} | {kept:>23.0f}")
    window = min(10 * 60, ARGS.minutes * 60 / 3)
    first_minutes = max((max(r) for t, r in samples if t < window and r), default=0.0)
    peak = max((max(r) for _, r in samples if r), default=0.0)
    last_minutes = max((max(r) for t, r in samples if t >= ARGS.minutes * 60 - window and r), default=0.0)
    first, last = (cycles[0][1], cycles[-1][1]) if len(cycles) >= 2 else (first_minutes, peak)
    in_waves = [s for w, s in latencies if any(a <= w < b for a, b in waves)]
    outside = [s for w, s in latencies if not any(a <= w < b for a, b in waves)]
    print(
        f"worker RSS: largest {peak:.0f} MB; first {window / 60:.0f} min (no digest wave yet) {first_minutes:.0f} MB, "
        f"last {window / 60:.0f} min {last_minutes:.0f} MB; "
        f"peak of the first digest wave's cycle {first:.0f} MB, of the last {last:.0f} MB (target: plateau below "
        f"{RSS_TARGET_MB} MB); ingest p99 {p99(outside):.0f} ms outside digest waves, {p99(in_waves):.0f} ms in "
        f"their first 2 minutes; load errors {errors}"
    )
    # Both readings of "no growth": wave against wave, and the last minutes against the first (which
    # hold no digest wave, so this one also bounds what a wave adds).
    met = peak < RSS_TARGET_MB and last <= first + 10 and last_minutes <= first_minutes + 10
    label = f"mixed soak, {ARGS.minutes:g} min"
    record(label, "worker RSS, largest process, last digest wave", last, "MB", target=f"plateau < {RSS_TARGET_MB} MB",
           met=met, higher_is_better=False, first_wave_mb=round(first, 1), first_10_min_mb=round(first_minutes, 1),
           last_10_min_mb=round(last_minutes, 1), peak_mb=round(peak, 1),
           kept_between_waves_mb=[round(kept, 1) for _, _, kept in cycles], minutes=ARGS.minutes)  # fmt: skip
    record(label, "ingest p99 during digest waves", p99(in_waves), "ms", baseline=p99(outside),
           baseline_label="the same outside the waves", higher_is_better=False)  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
