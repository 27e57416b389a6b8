"""Click redirect benchmark: redirects/s and p99 at 64 concurrent keep-alive connections against a
real uvicorn on 127.0.0.1, then a count check that every served click became a history row.
A naive baseline (scripts/bench/naive_click_app.py: one synchronous DB lookup + INSERT per
request through the threadpool) is measured in the same run. Loopback only, bounded in time.

    .venv/bin/python scripts/bench/click.py [--seconds 10] [--client auto|wrk|python]

Load generator: `wrk` (C, Debian package "wrk") when installed, else the project's asyncio
client (scripts/bench/loadgen.py), which costs more CPU on the same 2 cores.
Target (2 cores, generator included): >= 10,000 redirects/s, p99 <= 10 ms.
Database: BENCH_DATABASE_URL (default postgresql://localhost/notify_bench_tracking), created and
migrated here; its tracking tables are emptied first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
BENCH_DB = os.environ.get("BENCH_DATABASE_URL", "postgresql://localhost/notify_bench_tracking")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("APP_ENV", "development")
os.environ["BASE_URL"] = "http://127.0.0.1"

from app.platform import config, db, migrate  # noqa: E402
from scripts.bench.loadgen import build_request, free_port, run_load, start_server  # noqa: E402
from scripts.bench.shared import record  # noqa: E402
from tracking import links  # noqa: E402

CONNECTIONS = 64
FLUSH_SECONDS = float(os.environ.get("TRACKING_FLUSH_SECONDS", "0.2"))
UA = "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_0) AppleWebKit/605.1.15 Version/17.0 Safari/605.1.15"


def prepare(n_links: int = 50, n_subscribers: int = 400) -> list[str]:
    """Links of one newsletter rewritten for many recipients: the click paths mails would carry."""
    config.reload()
    migrate.migrate(BENCH_DB)
    db.init(BENCH_DB)
    with db.raw_cursor() as cur:
        cur.execute("TRUNCATE email_link_history, legacy_link_codes, email_links RESTART IDENTITY CASCADE")
    html = "".join(f'<a href="https://example.com/article/{i}?utm_source=mail">{i}</a>' for i in range(n_links))
    rewriter = links.LinkRewriter("newsletter", 1)
    paths = []
    for sub in range(1, n_subscribers + 1):
        out = rewriter.rewrite(html, sub)
        paths += re.findall(r'href="http://127\.0\.0\.1(/c/[^"]+)"', out)
    return paths


def history_rows() -> int:
    return db.query("SELECT count(*) FROM email_link_history")[0][0]


def run_wrk(port: int, paths: list[str], seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "paths.lua"
        lua.write_text(
            "local paths = {" + ",".join(f'"{p}"' for p in paths) + "}\n"
            "local n = #paths\nlocal i = 0\n"
            f'wrk.headers["User-Agent"] = "{UA}"\n'
            'request = function()\n  i = i % n + 1\n  return wrk.format("GET", paths[i])\nend\n'
        )
        out = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{CONNECTIONS}",
                f"-d{round(seconds)}s",
                "--latency",
                "-s",
                str(lua),
                f"http://127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    text = out.stdout
    if " requests in " not in text:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    count = int(re.search(r"(\d+) requests in", text).group(1))
    elapsed = float(re.search(r"requests in ([\d.]+)s", text).group(1))

    def ms(label):
        m = re.search(rf"\s{label}%\s+([\d.]+)(us|ms|s)\b", text)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket_errors = re.search(r"Socket errors: (.*)", text)
    return {
        "client": "wrk",
        "count": count,
        "rate": count / elapsed,
        "p50_ms": ms("50"),
        "p99_ms": ms("99"),
        "bad_responses": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "none",
        "in_flight_at_stop": CONNECTIONS,
    }


def run_python(port: int, paths: list[str], seconds: float) -> dict:
    reqs = [build_request("GET", p, headers={"User-Agent": UA}) for p in paths]
    res = asyncio.run(run_load(port, lambda i: reqs[i % len(reqs)], CONNECTIONS, seconds))
    return {
        "client": "python",
        "count": res.count,
        "rate": res.rate,
        "p50_ms": res.pct(0.5),
        "p99_ms": res.pct(0.99),
        "bad_responses": res.count - res.statuses.get(302, 0),
        "socket_errors": "none",
        "in_flight_at_stop": 0,
    }


def measure(app: str, paths: list[str], seconds: float, client: str, env: dict, label: str) -> dict:
    port = free_port()
    before = history_rows()
    proc = start_server(app, port, env)
    try:
        # Warm-up (caches, connections): 2 s, not counted in the rate but checked in the count.
        warm = run_python(port, paths, 1.0)
        result = run_wrk(port, paths, seconds) if client == "wrk" else run_python(port, paths, seconds)
        time.sleep(FLUSH_SECONDS + 1.0)  # the documented window, then the rows must be there
        rows_after_window = history_rows() - before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    served = warm["count"] + result["count"]
    rows_final = history_rows() - before
    # wrk stops with requests in flight: those may be served and recorded without being counted.
    ok = served <= rows_after_window <= served + result["in_flight_at_stop"] and rows_final == rows_after_window
    return {
        **result,
        "label": label,
        "served": served,
        "rows_after_window": rows_after_window,
        "rows_after_sigterm": rows_final,
        "count_ok": ok,
    }


def show(r: dict) -> None:
    print(
        f"  {r['label']:<34} {r['rate']:>9,.0f} redirects/s   p50 {r['p50_ms']:6.2f} ms   p99 {r['p99_ms']:6.2f} ms"
        f"   [{r['client']}; non-3xx {r['bad_responses']}; socket errors: {r['socket_errors']}]"
    )
    print(
        f"  {'':<34} served {r['served']:,} → history rows {r['rows_after_window']:,} after the "
        f"{FLUSH_SECONDS}s window, {r['rows_after_sigterm']:,} after SIGTERM: "
        f"{'OK, every click recorded' if r['count_ok'] else 'MISMATCH'}"
    )


def record_results(fast: dict, naive: dict, args, client: str) -> None:
    """The figures for BENCHMARKS.md (scripts/bench/report.py); the target's two halves on their figures."""
    bench = f"click redirects, {CONNECTIONS} connections"
    label = "naive (sync lookup + INSERT per request)"
    details = {
        "client": client,
        "connections": CONNECTIONS,
        "seconds": args.seconds,
        "baseline_seconds": args.baseline_seconds,
        "flush_seconds": FLUSH_SECONDS,
        "every_click_recorded": fast["count_ok"],
        "baseline_every_click_recorded": naive["count_ok"],
    }
    record(
        bench,
        "redirects/s",
        fast["rate"],
        "redirects/s",
        baseline=naive["rate"],
        baseline_label=label,
        target=">= 10,000 redirects/s on 2 cores, generator included, every click recorded",
        met=fast["rate"] >= 10_000 and fast["count_ok"],
        **details,
    )
    record(
        bench,
        "p50 latency",
        fast["p50_ms"],
        "ms",
        baseline=naive["p50_ms"],
        baseline_label=label,
        higher_is_better=False,
        **details,
    )
    record(
        bench,
        "p99 latency",
        fast["p99_ms"],
        "ms",
        baseline=naive["p99_ms"],
        baseline_label=label,
        target="<= 10 ms on 2 cores, generator included",
        met=fast["p99_ms"] <= 10,
        higher_is_better=False,
        **details,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()
    client = ("wrk" if shutil.which("wrk") else "python") if args.client == "auto" else args.client
    if not 0 < FLUSH_SECONDS <= 5:
        parser.error("TRACKING_FLUSH_SECONDS must be in (0, 5] here: the count check waits one window")
    paths = prepare()
    env = {
        **os.environ,
        "DATABASE_URL": BENCH_DB,
        "TRACKING_FLUSH_SECONDS": str(FLUSH_SECONDS),
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    print(
        f"click benchmark: {len(paths):,} distinct click codes, {CONNECTIONS} keep-alive connections, "
        f"{os.cpu_count()} cores shared by server, Postgres and the {client} load generator"
    )
    results = [measure("app.web:app", paths, args.seconds, client, env, "tracking app (buffered history)")]
    show(results[-1])
    # The threadpool runs up to 40 sync requests at once: give the naive app a pool that fits them.
    results.append(
        measure(
            "scripts.bench.naive_click_app:naive_app",
            paths,
            args.baseline_seconds,
            client,
            {**env, "DB_POOL_SIZE": "64"},
            "naive: sync lookup+INSERT/request",
        )
    )
    show(results[-1])
    fast, naive = results
    print(
        f"  speed-up over naive: {fast['rate'] / naive['rate']:.1f}x;  target >= 10,000/s and p99 <= 10 ms: "
        f"{'MET' if fast['rate'] >= 10_000 and fast['p99_ms'] <= 10 else 'NOT MET'}"
    )
    record_results(fast, naive, args, client)
    return 0 if all(r["count_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
