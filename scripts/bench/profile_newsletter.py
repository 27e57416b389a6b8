"""Where a newsletter mail's CPU goes over SMTP: the worker's send loop (app/newsletter/sender.py
send_batch: claim, render, tracked links, MIME, SMTP, record) in one process against the counting
sink (scripts/bench/smtp_sink.py, 0 ms) on a spare port, with the Postgres server's, the sink's and
the Redis server's CPU for the same mails measured from /proc.

    .venv/bin/python scripts/bench/profile_newsletter.py [--recipients 20000] [--stages] \\
        [--database-url postgresql://127.0.0.1/notify_bench_profile_nl] [--redis-url redis://127.0.0.1:6379/11]

Default mode: cProfile, the worker's own time by area and the top functions (cProfile slows Python
about 1.5-2x: read the split, not the absolute). --stages: no cProfile; the thread CPU time inside
each step of the path (time.thread_time, a stage called inside another is not counted in it), the
SMTP event loop thread's as the rest of the process. The mail is the benchmark's
(scripts/bench/shared.py HTML/TEXT, peer_postoffice.py's subject) with every setting at its default
(tracking on, List-Unsubscribe on); --repeat runs the measured send several times (a new newsletter
each, the same subscribers) and prints each run. The collector is tuned as a worker's (gc.freeze,
threshold 50,000). It empties its database's newsletter tables and flushes its Redis db.
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
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--recipients", type=int, default=20_000)
p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_profile_nl")
p.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
p.add_argument("--stages", action="store_true", help="no cProfile: thread CPU per stage, unslowed")
p.add_argument("--repeat", type=int, default=1, help="measured sends (a new newsletter each)")
p.add_argument("--top", type=int, default=25)
p.add_argument("--loop", action="store_true", help="cProfile the SMTP event loop thread instead of the send thread")
p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a setting other than its default")
args = p.parse_args()
if urlparse(args.redis_url).path.strip("/") in ("", "0"):
    p.error("this script flushes its Redis db: give it its own (not db 0)")
if urlparse(args.database_url).path.strip("/") in ("notify", "notify_test", "postgres", ""):
    p.error("this script empties its database's newsletter tables: give it its own")

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    PORT = s.getsockname()[1]
os.environ.update(
    {
        "APP_ENV": "development",
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "MAIL_PROVIDER": "smtp",
        "SMTP_URL": f"smtp://127.0.0.1:{PORT}",
        "LOG_LEVEL": "WARNING",
    }
)
os.environ.update(item.split("=", 1) for item in args.set)

import psycopg2  # noqa: E402
import redis  # noqa: E402

from app.newsletter import outbox, sender, service, waits  # noqa: E402
from app.platform import config, db, mail, migrate, providers  # noqa: E402
from scripts.bench import shared  # noqa: E402
from scripts.bench import stages as stages_mod  # noqa: E402

config.reload()

SUBJECT = "Weekly letter for {{name}}"  # peer_postoffice.py's

AREAS = [
    ("psycopg2 (waiting on Postgres, adapting)", ("psycopg2", "<method 'execute'", "<method 'fetch")),
    ("redis client (limiter, alive mark)", ("redis/", "ratelimit.py", "kick.py")),
    ("SMTP client + event loop", ("providers/smtp", "asyncio", "selectors", "socket", "ssl", "uvloop")),
    ("MIME building (app/platform/mail.py, email package)", ("email/", "app/platform/mail.py", "dkim")),
    ("tracking: links and codes", ("tracking/",)),
    ("render (Mustache, i18n, tokens)", ("app/platform/mustache.py", "template.py", "i18n", "babel", "tokens.py")),
    ("send loop glue (sender, rows, waits)", ("app/newsletter/",)),
    ("threads, locks, progress", ("threading", "concurrent/", "queue.py", "providers/base.py")),
]


def timed_stages() -> dict[str, float]:
    """Wrap each step of the send loop so the thread's CPU time inside it is summed per stage."""
    from app.newsletter import kick, ratelimit
    from app.platform.providers import smtp
    from tracking import links

    timer = stages_mod.StageTimer()
    wrap = timer.wrap
    wrap(waits, "claim", "claim (waits.claim)")
    wrap(sender.Renderer, "render", "per-recipient glue (Renderer.render)")
    wrap(sender.template.Compiled, "render", "Mustache render (Compiled.render)")
    wrap(links, "rewrite_many_with_clicks", "tracked links + pixel (rewrite)")
    from app.newsletter import tracked  # a plan's click and pixel codes (app/newsletter/tracked.py)

    wrap(tracked.Tracker, "values", "tracked links + pixel (planned: the codes)")
    wrap(sender.template.Compiled, "full_context", "context (words, greeting)")
    wrap(sender.tokens, "unsubscribe_url", "tokens (unsubscribe/preferences)")
    wrap(sender.tokens, "preferences_url", "tokens (unsubscribe/preferences)")
    wrap(smtp.SMTPProvider, "prepare", "MIME (provider.prepare / mail.build)")
    wrap(smtp.SMTPProvider, "deliver", "SMTP deliver (calling thread)")
    wrap(waits, "mark", "record outcomes (waits.mark)")
    wrap(sender._Outcomes, "flush", "flush + may_send (between mails)")
    wrap(kick, "mark_alive", "redis: alive mark")
    wrap(ratelimit.AdaptiveRateLimiter, "acquire", "redis: rate limiter")
    return timer.totals


def new_newsletter(n: int) -> int:
    nl = service.create(service.validate_new({"subject": SUBJECT, "html": shared.HTML, "text": shared.TEXT})[0])
    service.request_send(nl, {"kind": "all"})
    outbox.create_outbox(nl)
    return nl


def send_all(newsletter_id: int, provider) -> int:
    sent = 0
    while True:
        stats = sender.send_batch(newsletter_id, provider=provider, budget_seconds=5.0, reenqueue=False)
        sent += stats.sent
        if stats.retry_in is None or stats.outcome.startswith("done"):
            return sent


def main() -> None:
    n = args.recipients
    migrate.migrate(args.database_url)
    db.init(args.database_url)
    rclient = redis.Redis.from_url(args.redis_url)
    rclient.flushdb()
    redis_pid = int(rclient.info("server")["process_id"])
    shared.seed_subscribers(n)
    sink = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/bench/smtp_sink.py"), "--port", str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    sink.stdout.readline()
    provider = providers.get_provider()
    # warm-up: a small newsletter (templates, connections, the links' rows of another newsletter)
    warm = service.create(service.validate_new({"subject": SUBJECT, "html": shared.HTML, "text": shared.TEXT})[0])
    service.request_send(warm, {"kind": "user_ids", "user_ids": [f"u{i}" for i in range(1, 501)]})
    outbox.create_outbox(warm)
    send_all(warm, provider)
    gc.freeze()  # as a worker process does after boot (actors/broker.py CollectorTuning)
    gc.set_threshold(50_000, 20, 100)
    conn = psycopg2.connect(args.database_url)
    conn.autocommit = True
    pg = shared.PostgresCPU(conn, urlparse(args.database_url).path.lstrip("/"))
    stages = timed_stages() if args.stages else None
    settings = config.get()
    print(
        f"profile_newsletter: {n:,} mails per run over SMTP to a 0 ms sink, tracking "
        f"{'on' if settings.tracking else 'off'}, DKIM {'on' if mail.dkim_enabled() else 'off'}"
        f"{', under cProfile' if stages is None else ', --stages'}; settings {args.set or 'defaults'}"
    )
    profiler = cProfile.Profile()
    loop = provider._async_sender()._loop if args.loop else None
    totals = defaultdict(float)
    for run in range(args.repeat):
        nl = new_newsletter(n)
        rclient.delete(*rclient.keys("dramatiq:*") or [b"-"])
        if stages is not None:
            stages.clear()
        pg.start()
        sink0, redis0 = shared.cpu_seconds(sink.pid), shared.cpu_seconds(redis_pid)
        cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        if stages is None:
            if loop is not None:
                loop.call_soon_threadsafe(profiler.enable)
            else:
                profiler.enable()
        sent = send_all(nl, provider)
        if loop is not None:
            loop.call_soon_threadsafe(profiler.disable)
            time.sleep(0.2)
        profiler.disable()
        cpu, thread, wall = time.process_time() - cpu0, time.thread_time() - thread0, time.perf_counter() - wall0
        pg_cpu = pg.stop()["seconds"]
        sink_cpu, redis_cpu = shared.cpu_seconds(sink.pid) - sink0, shared.cpu_seconds(redis_pid) - redis0
        per = 1e6 / n
        total = cpu + pg_cpu + sink_cpu + redis_cpu
        print(
            f"  run {run + 1}: {sent:,} sent in {wall:.2f} s ({n / wall:,.0f}/s); CPU us/mail: worker {cpu * per:.0f} "
            f"(send thread {thread * per:.0f}, other threads {(cpu - thread) * per:.0f}), postgres {pg_cpu * per:.0f}, "
            f"sink {sink_cpu * per:.0f}, redis {redis_cpu * per:.0f}; total {total * per:.0f}"
        )
        for key, value in (
            ("worker", cpu),
            ("thread", thread),
            ("pg", pg_cpu),
            ("sink", sink_cpu),
            ("redis", redis_cpu),
        ):
            totals[key] += value
        if stages is not None:
            for stage, seconds in sorted(stages.items(), key=lambda kv: -kv[1]):
                print(f"      {stage:<42s} {seconds * per:6.1f} us/mail")
            rest = (thread - sum(stages.values())) * per
            print(f"      {'(rest of the send thread: the loop glue)':<42s} {rest:6.1f} us/mail")
    providers.close_all()
    sink.terminate()
    if args.repeat > 1:
        per = 1e6 / (n * args.repeat)
        print(
            f"  mean: worker {totals['worker'] * per:.0f} (send thread {totals['thread'] * per:.0f}), postgres "
            f"{totals['pg'] * per:.0f}, sink {totals['sink'] * per:.0f}, redis {totals['redis'] * per:.0f}; total "
            f"{sum(v for k, v in totals.items() if k != 'thread') * per:.0f} us/mail"
        )
    if stages is None:
        stats = pstats.Stats(profiler)
        by_area, total = stages_mod.by_area(stats, AREAS)
        per = 1e6 / (n * args.repeat)
        print("  send thread's time by area under cProfile (own time):")
        for area, seconds in sorted(by_area.items(), key=lambda kv: -kv[1]):
            print(f"    {area:<52s} {seconds * per:7.1f} us/mail  {seconds / total:6.1%}")
        print(f"  top {args.top} functions by own time:")
        stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(args.top)


if __name__ == "__main__":
    main()
