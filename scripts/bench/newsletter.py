"""Newsletter benchmark: N recipients end to end through real Dramatiq workers to a loopback fake
provider API that adds a per-call delay, at 0 ms and 50 ms — SendGrid (beside a naive baseline: one
task per recipient, one provider call each, measured in the same run on a sample and extrapolated),
then Amazon SES, Postmark and Mailgun, each through its own fake (tests/fake_providers.py) in the
same run — and the failover switch time: MAIL_PROVIDERS=postmark,ses, the primary starts answering
503 mid-send, and the time from its first 503 to the first mail the secondary accepted (by the
fakes' clock), the median of a few trials.

    .venv/bin/python scripts/bench/newsletter.py                      # 50,000 recipients, every provider
    .venv/bin/python scripts/bench/newsletter.py --recipients 1000000 --providers sendgrid
    .venv/bin/python scripts/bench/newsletter.py --providers ses --delays-ms 50 --failover-trials 0

Prints recipients/s, wall time (send requested -> newsletter done, outbox creation included) and
the workers' peak RSS (VmHWM of each worker process), one row per provider and delay. Targets on 2
cores: SendGrid 1M in <= 10 minutes at both delays; every provider RSS <= 150 MB and exactly once.
SES and Mailgun take one mail per request (16 at a time per sending thread), so at 0 ms their fake
(Python's threaded HTTP server, one request per mail) is much of what is measured. Its own database
(notify_bench_newsletter) and Redis db; 127.0.0.1 only; every wait is bounded (--timeout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# provider -> what its rows are called in BENCHMARKS.md
PROVIDERS = {"sendgrid": "SendGrid", "ses": "Amazon SES", "postmark": "Postmark", "mailgun": "Mailgun"}
FAILOVER = ("postmark", "ses")  # MAIL_PROVIDERS of the failover trials: primary, secondary
DEFAULT_DB = "postgresql://127.0.0.1/notify_bench_newsletter"
DEFAULT_REDIS = "redis://127.0.0.1:6379/12"
WORKER_LOG = "/tmp/notify-bench-newsletter-worker.log"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipients", type=int, default=50_000)
    p.add_argument("--delays-ms", default="0,50", help="per-call delays of the fake provider APIs")
    p.add_argument(
        "--providers",
        default=",".join(PROVIDERS),
        help=f"whose newsletter rows, in order: {', '.join(PROVIDERS)} (the naive baseline is SendGrid's)",
    )
    p.add_argument("--failover-trials", type=int, default=3, help="failover switch trials (median reported); 0: none")
    p.add_argument("--failover-recipients", type=int, default=2000, help="recipients of each failover trial")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8, help="worker threads per process (the Procfile's default)")
    p.add_argument("--chains", type=int, default=None, help="NEWSLETTER_SEND_CHAINS (default: the service's)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="SEND_BATCH_SIZE (default: the service's, which is the provider's own: 500 for SendGrid)",
    )
    p.add_argument("--baseline-sample", type=int, default=2000)
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument(
        "--respect-quiet-hours",
        action="store_true",
        help="send with respect_quiet_hours (scripts/bench/quiet_budget.py)",
    )
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per run")
    p.add_argument("--database-url", default=DEFAULT_DB)
    p.add_argument("--redis-url", default=DEFAULT_REDIS)
    args = p.parse_args()
    unknown = {n.strip() for n in args.providers.split(",") if n.strip()} - set(PROVIDERS)
    if unknown:
        p.error(f"unknown providers {sorted(unknown)}: use {', '.join(PROVIDERS)}")
    for url in (args.database_url, args.redis_url):
        if "127.0.0.1" not in url and "localhost" not in url:
            p.error("the benchmark runs against loopback services only")
    return args


ARGS = parse_args()
os.environ.update(
    APP_ENV="test",
    DATABASE_URL=ARGS.database_url,
    REDIS_URL=ARGS.redis_url,
    LOG_LEVEL="WARNING",
    MAIL_PROVIDER="sendgrid",
    SENDGRID_API_KEY="bench",
)

import redis  # noqa: E402

from app.platform import db, migrate  # noqa: E402
from scripts.bench.shared import HTML, peak_rss_mb, record, seed_subscribers, stop_group, wait_heartbeats  # noqa: E402

RSS_TARGET_MB = 150
MILLION_TARGET_S = 600  # 1M recipients in 10 minutes at the measured rate


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare_database(n: int) -> None:
    migrate.migrate(ARGS.database_url)
    db.init(ARGS.database_url)
    seed_subscribers(n, log)


def start_sink(delay_ms: float, provider: str = "sendgrid") -> tuple[subprocess.Popen, dict[str, str]]:
    """The provider's fake in a process of its own: (process, the worker settings that point at it)."""
    import json

    module = ["tests.fake_sendgrid"] if provider == "sendgrid" else ["tests.fake_providers", provider]
    proc = subprocess.Popen(
        [sys.executable, "-m", *module, "--delay", str(delay_ms / 1000)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline().strip()
    if provider == "sendgrid":
        assert first.startswith("http://127.0.0.1:"), first
        return proc, {"MAIL_PROVIDER": "sendgrid", "SENDGRID_API_URL": first}
    return proc, {"MAIL_PROVIDER": provider, **json.loads(first)}


def sink_counters(proc) -> dict:
    import json

    proc.stdin.write("\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def stop(proc) -> None:
    stop_group(proc)


def start_worker(sink: dict[str, str], modules=("actors",), **extra: str) -> subprocess.Popen:
    env = {**os.environ, **sink, "PROVIDER_RATE_PER_SECOND": "0", "PYTHONPATH": str(ROOT), **extra}
    if ARGS.batch_size:
        env["SEND_BATCH_SIZE"] = str(ARGS.batch_size)
    if ARGS.chains:
        env["NEWSLETTER_SEND_CHAINS"] = str(ARGS.chains)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dramatiq",
            *modules,
            "--processes",
            str(ARGS.processes),
            "--threads",
            str(ARGS.threads),
            "--queues",
            "newsletter",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(WORKER_LOG, "a"),
    )


def wait_ready(worker) -> None:
    wait_heartbeats(ARGS.redis_url, ARGS.processes, worker)


def row_counts(newsletter_id: int) -> dict:
    return dict(
        db.query("SELECT status, count(*) FROM email_log WHERE newsletter_id = %s GROUP BY status", (newsletter_id,))
    )


def run_pipeline(delay_ms: float, provider: str = "sendgrid") -> dict:
    from app.newsletter import service

    redis.Redis.from_url(ARGS.redis_url).flushdb()
    sink, url = start_sink(delay_ms, provider)
    worker = start_worker(url)
    try:
        wait_ready(worker)
        values, errors = service.validate_new({"subject": "Weekly letter for {{name}}", "html": HTML})
        assert not errors, errors
        newsletter_id = service.create(values)
        log(
            f"run: {ARGS.recipients:,} recipients via {PROVIDERS[provider]}, sink delay {delay_ms:g} ms "
            f"(newsletter {newsletter_id})"
        )
        started = time.monotonic()
        service.request_send(newsletter_id, {"kind": "all"}, respect_quiet_hours=ARGS.respect_quiet_hours)
        deadline, last_report = started + ARGS.timeout, started
        while True:
            status = db.query("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))[0][0]
            now = time.monotonic()
            if status == "done":
                break
            if now > deadline:
                raise SystemExit(f"timed out after {ARGS.timeout:.0f}s: {row_counts(newsletter_id)}")
            if now - last_report >= 15:
                log(f"  {now - started:5.0f}s  {row_counts(newsletter_id)}  rss {peak_rss_mb(worker.pid)[0]:.0f} MB")
                last_report = now
            time.sleep(0.2)
        wall = time.monotonic() - started
        rss, parent_rss = peak_rss_mb(worker.pid)
        counts = row_counts(newsletter_id)
        sink_seen = sink_counters(sink)
    finally:
        stop(worker)
        sink.stdin.close()
        sink.wait(timeout=30)
    ok = (
        counts == {"sent": ARGS.recipients}
        and sink_seen["unique"] == ARGS.recipients
        and sink_seen["accepted"] == ARGS.recipients
    )
    return {
        "provider": provider,
        "delay_ms": delay_ms,
        "wall_s": wall,
        "rate": ARGS.recipients / wall,
        "rss_mb": rss,
        "parent_rss_mb": parent_rss,
        "calls": sink_seen["calls"],
        "ok": ok,
        "counts": counts,
        "sink": sink_seen,
    }


def run_naive(delay_ms: float) -> dict:
    """One task + one provider call per recipient, same workers and sink, on a sample."""
    import orjson

    from app.newsletter import outbox, service

    sample = min(ARGS.baseline_sample, ARGS.recipients)
    client = redis.Redis.from_url(ARGS.redis_url)
    values, _ = service.validate_new({"subject": "Weekly letter for {{name}}", "html": HTML})
    newsletter_id = service.create(values)
    audience = {"kind": "user_ids", "user_ids": [f"u{i}" for i in range(1, sample + 1)]}
    # The outbox is built here, outside the measurement, while the newsletter is paused; the send
    # chains it kicks are then flushed from Redis so only the naive tasks send.
    db.query(
        "UPDATE newsletters SET status = 'paused', audience = %s, send_requested_at = now() WHERE id = %s",
        (orjson.dumps(audience).decode(), newsletter_id),
    )
    outbox.create_outbox(newsletter_id)
    client.flushdb()
    db.query("UPDATE newsletters SET status = 'sending' WHERE id = %s", (newsletter_id,))
    sink, url = start_sink(delay_ms)
    worker = start_worker(url, modules=("scripts.bench.newsletter_naive",))
    try:
        wait_ready(worker)
        from scripts.bench import newsletter_naive

        started = time.monotonic()
        newsletter_naive.enqueue(newsletter_id)
        deadline = started + ARGS.timeout
        while row_counts(newsletter_id).get("sent", 0) < sample:
            if time.monotonic() > deadline:
                raise SystemExit("naive baseline timed out")
            time.sleep(0.1)
        wall = time.monotonic() - started
        rss, _ = peak_rss_mb(worker.pid)
        sink_seen = sink_counters(sink)
        # Naive tasks never run the done check; close the newsletter so status tools see it finished.
        db.query("UPDATE newsletters SET status = 'done', completed_at = now() WHERE id = %s", (newsletter_id,))
    finally:
        stop(worker)
        sink.stdin.close()
        sink.wait(timeout=30)
    assert sink_seen["calls"] == sample, f"naive baseline made {sink_seen['calls']} calls for {sample} recipients"
    rate = sample / wall
    return {
        "delay_ms": delay_ms,
        "sample": sample,
        "wall_s": wall,
        "rate": rate,
        "rss_mb": rss,
        "calls": sink_seen["calls"],
        "extrapolated_s": ARGS.recipients / rate,
    }


def run_failover_trial(trial: int) -> dict:
    """MAIL_PROVIDERS=postmark,ses through two fakes in this process; once the primary took a fifth
    of the trial's recipients it answers 503 to the end. The send is held to a rate at which it lasts
    about five seconds, so the outage lands mid-send. Returns the switch time: the primary's first
    503 -> the first mail the secondary accepted, by the fakes' clock (one machine's monotonic clock)."""
    import orjson

    from app.newsletter import service
    from tests.fake_providers import FakePostmark, FakeSES, settings_for

    n = ARGS.failover_recipients
    redis.Redis.from_url(ARGS.redis_url).flushdb()
    with FakePostmark(record=False) as primary, FakeSES(record=False) as secondary:
        worker = start_worker(
            {"MAIL_PROVIDER": "smtp", **settings_for(primary), **settings_for(secondary)},
            MAIL_PROVIDERS=",".join(FAILOVER),
            PROVIDER_RATE_PER_SECOND=str(max(10, n // 5)),
            SEND_BATCH_SIZE=str(ARGS.batch_size or 20),
        )
        try:
            wait_ready(worker)
            values, errors = service.validate_new({"subject": "Failover letter for {{name}}", "html": HTML})
            assert not errors, errors
            newsletter_id = service.create(values)
            audience = {"kind": "user_ids", "user_ids": [f"u{i}" for i in range(1, n + 1)]}
            service.request_send(newsletter_id, orjson.loads(orjson.dumps(audience)))
            deadline, outage_at = time.monotonic() + ARGS.timeout, None
            while db.query("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))[0][0] != "done":
                with primary.lock:
                    taken = sum(primary.accepted.values())
                if outage_at is None and taken >= n // 5:
                    outage_at = time.monotonic()
                    primary.fail_for(ARGS.timeout)
                if time.monotonic() > deadline:
                    raise SystemExit(f"failover trial timed out: {row_counts(newsletter_id)}")
                time.sleep(0.02)
            counts = row_counts(newsletter_id)
        finally:
            stop(worker)
        first_503 = primary.first_answer(503)
        switched = secondary.first_answer(accepted=True, after=first_503) if first_503 is not None else None
        both = primary.recipients() + secondary.recipients()
    ok = counts == {"sent": n} and len(both) == n and set(both.values()) == {1}
    switch = None if switched is None or first_503 is None else switched - first_503
    log(
        f"  failover trial {trial}: switch {'-' if switch is None else f'{switch * 1000:.0f} ms'} "
        f"(first 503 {0 if first_503 is None or outage_at is None else (first_503 - outage_at) * 1000:.0f} ms "
        f"after the outage began), primary {sum(primary.accepted.values()):,} / secondary "
        f"{sum(secondary.accepted.values()):,} mails, exactly once: {ok}"
    )
    return {"switch_s": switch, "ok": ok}


def record_failover(trials: list[dict]) -> float | None:
    switches = sorted(t["switch_s"] for t in trials if t["switch_s"] is not None)
    if not switches:
        return None
    median = statistics.median(switches)
    record(
        f"failover {FAILOVER[0]} -> {FAILOVER[1]}, primary 503 mid-send, "
        f"{ARGS.failover_recipients:,}-recipient newsletter",
        f"switch time, primary's first 503 -> secondary's first accepted mail (median of {len(trials)})",
        median * 1000,
        "ms",
        target="<= 5 s, exactly once",
        met=median <= 5 and all(t["ok"] for t in trials),
        higher_is_better=False,
        trials_ms=[round(x * 1000, 1) for x in switches],
        exactly_once=all(t["ok"] for t in trials),
    )
    return median


def record_results(r: dict, b: dict | None) -> None:
    """The figures of one provider and delay for BENCHMARKS.md (scripts/bench/report.py)."""
    bench = f"newsletter via fake {PROVIDERS[r['provider']]} API, call delay {r['delay_ms']:g} ms"
    naive = f"naive (task + API call per recipient), {b['sample']:,}-recipient sample" if b else ""
    million_s = r["wall_s"] * 1_000_000 / ARGS.recipients
    sendgrid = r["provider"] == "sendgrid"  # the 1M-in-10-min target is SendGrid's (batches of up to 1,000)
    details = {
        "provider": r["provider"],
        "recipients": ARGS.recipients,
        "delay_ms": r["delay_ms"],
        "processes": ARGS.processes,
        "threads": ARGS.threads,
        "chains": ARGS.chains or ARGS.processes * ARGS.threads,
        "batch_size": ARGS.batch_size,
        "provider_calls": r["calls"],
        "exactly_once": r["ok"],
    }
    record(
        bench,
        "recipients/s",
        r["rate"],
        "recipients/s",
        baseline=b["rate"] if b else None,
        baseline_label=naive,
        target=f"1M recipients <= {MILLION_TARGET_S // 60} min on 2 cores, exactly once"
        if sendgrid
        else "exactly once",
        met=r["ok"] and (million_s <= MILLION_TARGET_S or not sendgrid),
        million_extrapolated_s=round(million_s, 1),
        **details,
    )
    record(
        bench,
        "wall time, send requested -> done",
        r["wall_s"],
        "s",
        baseline=b["extrapolated_s"] if b else None,
        baseline_label=naive + " (extrapolated)" if b else "",
        higher_is_better=False,
        **details,
    )
    record(
        bench,
        "worker peak RSS (largest process)",
        r["rss_mb"],
        "MB",
        baseline=b["rss_mb"] if b else None,
        baseline_label=naive,
        target=f"<= {RSS_TARGET_MB} MB",
        met=r["rss_mb"] <= RSS_TARGET_MB,
        higher_is_better=False,
        parent_rss_mb=round(r["parent_rss_mb"], 1),
        **details,
    )


def main() -> int:
    delays = [float(d) for d in ARGS.delays_ms.split(",") if d.strip()]
    providers = [n.strip() for n in ARGS.providers.split(",") if n.strip()]
    log(
        f"newsletter benchmark: {ARGS.recipients:,} recipients, providers {providers}, workers "
        f"{ARGS.processes}x{ARGS.threads} threads, batch {ARGS.batch_size or 'default'}, delays {delays} ms, "
        f"cores {os.cpu_count()}"
    )
    prepare_database(max(ARGS.recipients, ARGS.failover_recipients if ARGS.failover_trials else 0))
    results: list[dict] = []
    naive: dict[float, dict] = {}  # SendGrid's naive baseline, by delay
    for provider in providers:
        for delay in delays:
            results.append(run_pipeline(delay, provider))
            r = results[-1]
            log(
                f"  done: {r['rate']:,.0f} recipients/s, {r['wall_s']:.1f}s, worker peak RSS {r['rss_mb']:.0f} MB, "
                f"{r['calls']:,} provider calls, exactly once: {r['ok']}"
            )
            if provider == "sendgrid" and not ARGS.skip_baseline:
                naive[delay] = b = run_naive(delay)
                log(
                    f"  naive: {b['rate']:,.0f} recipients/s on a {b['sample']:,} sample "
                    f"-> {ARGS.recipients:,} in ~{b['extrapolated_s']:,.0f}s (extrapolated)"
                )
    trials = [run_failover_trial(i + 1) for i in range(ARGS.failover_trials)]
    print()
    print(
        f"Newsletter send, {ARGS.recipients:,} recipients, {ARGS.processes} worker processes x {ARGS.threads} "
        f"threads, batches of {ARGS.batch_size or 'the provider default (SendGrid, Postmark 500; SES, Mailgun 100)'}, "
        f"chains {ARGS.chains or 'default'}, {os.cpu_count()} cores"
    )
    print(
        f"{'provider':<10} | {'sink delay':>10} | {'recipients/s':>12} | {'wall':>9} | {'peak RSS':>8} | "
        f"{'calls':>7} | once | {'naive rec/s':>11} | naive wall (extrapolated)"
    )
    for r in results:
        b = naive.get(r["delay_ms"]) if r["provider"] == "sendgrid" else None
        naive_cols = (
            f"{b['rate']:>11,.0f} | {b['extrapolated_s']:,.0f}s (measured on {b['sample']:,})"
            if b
            else f"{'-':>11} | -"
        )
        print(
            f"{PROVIDERS[r['provider']]:<10} | {r['delay_ms']:>8g}ms | {r['rate']:>12,.0f} | {r['wall_s']:>8.1f}s | "
            f"{r['rss_mb']:>6.0f}MB | {r['calls']:>7,} | {'yes' if r['ok'] else 'NO'}  | {naive_cols}"
        )
    target_ok = all(
        r["ok"]
        and r["rss_mb"] <= RSS_TARGET_MB
        and (r["provider"] != "sendgrid" or r["wall_s"] * 1_000_000 / ARGS.recipients <= MILLION_TARGET_S)
        for r in results
    )
    for r in results:
        record_results(r, naive.get(r["delay_ms"]) if r["provider"] == "sendgrid" else None)
    if trials:
        median = record_failover(trials)
        shown = [f"{t['switch_s'] * 1000:.0f}" if t["switch_s"] is not None else "-" for t in trials]
        print(
            f"failover {FAILOVER[0]} -> {FAILOVER[1]} (primary 503 mid-send, {ARGS.failover_recipients:,} recipients): "
            f"switch {'-' if median is None else f'{median * 1000:.0f} ms'} median of {len(trials)} "
            f"({', '.join(shown)} ms), exactly once: {'yes' if all(t['ok'] for t in trials) else 'NO'}"
        )
        target_ok = target_ok and median is not None and median <= 5 and all(t["ok"] for t in trials)
    print(
        "targets (SendGrid: 1M <= 600 s at this rate; every provider: RSS <= 150 MB, exactly once; "
        f"failover switch <= 5 s): {'met' if target_ok else 'NOT met'}"
    )
    return 0 if target_ok else 1


if __name__ == "__main__":
    sys.exit(main())
