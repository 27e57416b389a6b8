"""Are the defaults fast? Our SMTP newsletter path (scripts/bench/peer_postoffice.py --skip-peer: the
public API, the Procfile worker, tracking and List-Unsubscribe on) at its default settings against the
hand-tuned settings an operator might try, at 0 ms and 50 ms relay delay, in one run.

    .venv/bin/python scripts/bench/knobs.py                       # 50,000 mails per run
    .venv/bin/python scripts/bench/knobs.py --recipients 5000 --delays 50

Each setting is varied alone around the defaults (one knob at a time), plus a combination of the two
that helped most one at a time. Every configuration runs --repeat times, in rounds (each round runs
every configuration once), and keeps its best figure, the default included, so noise and the
machine's drift do not favour either side. Target (issue 13):
the defaults within 10 % of the best configuration at each delay.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.bench.shared import read_records, record  # noqa: E402

# One knob at a time around the defaults, then the hand-tuned set the first benchmarks used.
CONFIGS: list[tuple[str, list[str]]] = [
    ("defaults", []),
    ("SMTP_POOL_SIZE=32", ["SMTP_POOL_SIZE=32"]),
    ("SMTP_POOL_MAX=128", ["SMTP_POOL_MAX=128"]),
    ("SMTP_POOL_MAX=512", ["SMTP_POOL_MAX=512"]),
    ("SEND_BATCH_SIZE=100", ["SEND_BATCH_SIZE=100"]),
    ("SEND_BATCH_SIZE=500", ["SEND_BATCH_SIZE=500"]),
    ("NEWSLETTER_SEND_CHAINS=2", ["NEWSLETTER_SEND_CHAINS=2"]),
    ("NEWSLETTER_SEND_CHAINS=8", ["NEWSLETTER_SEND_CHAINS=8"]),
    ("no chain growth", ["NEWSLETTER_SEND_CHAINS_MAX=4"]),
    ("WORKER_THREADS=16", ["WORKER_THREADS=16"]),
    ("pool 50 + chains 8", ["SMTP_POOL_SIZE=50", "NEWSLETTER_SEND_CHAINS=8"]),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 20,000 mails take 5 s at 0 ms: start-up (outbox, first connections) then moved figures by 25 %.
    p.add_argument("--recipients", type=int, default=50_000)
    p.add_argument("--delays", default="0,50", help="relay delays in ms, comma separated")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration (the best counts)")
    p.add_argument("--only", default="", help="comma-separated configuration names (defaults always run)")
    p.add_argument("--timeout", type=float, default=900.0)
    return p.parse_args()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_once(n: int, delay: float, settings: list[str], timeout: float) -> float | None:
    """mails/s of one run of ours, or None when it failed (not every mail delivered exactly once)."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as results:
        env = {**os.environ, "BENCH_RESULTS": results.name}
        argv = [
            sys.executable,
            str(ROOT / "scripts/bench/peer_postoffice.py"),
            "--skip-peer",
            "--recipients",
            str(n),
            "--smtp-delay-ms",
            str(delay),
            "--timeout",
            str(timeout),
        ]
        for item in settings:
            argv += ["--set", item]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 300)
        figures = read_records(results.name)
    rate = next((f for f in figures if f["figure"] == "mails/s"), None)
    if done.returncode != 0 or rate is None or not rate["met"]:
        log(f"  run failed (exit {done.returncode}): {done.stdout[-600:]}{done.stderr[-600:]}")
        return None
    return rate["value"]


def main() -> int:
    args = parse_args()
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    configs = [c for c in CONFIGS if c[0] == "defaults" or not wanted or c[0] in wanted]
    log(
        f"knobs: {args.recipients:,} mails per run, delays {delays} ms, {len(configs)} configurations, "
        f"best of {args.repeat}; load average {os.getloadavg()[0]:.1f}"
    )
    table: dict[float, dict[str, float | None]] = {}
    for delay in delays:
        runs: dict[str, list[float]] = {name: [] for name, _ in configs}
        # Round after round of every configuration, not each one's repeats back to back: this
        # shared machine's speed drifts over minutes, and the drift must not favour either side.
        for round_no in range(1, args.repeat + 1):
            for name, settings in configs:
                rate = run_once(args.recipients, delay, settings, args.timeout)
                if rate is not None:
                    runs[name].append(rate)
                log(f"  {delay:>3g} ms  {name:<26} {rate or 0:>8,.0f} mails/s  (round {round_no})")
        table[delay] = {name: max(rates) if rates else None for name, rates in runs.items()}
    print()
    print(
        f"Defaults against hand-tuned settings: our SMTP newsletter path, {args.recipients:,} mails per run "
        f"(best of {args.repeat}), {os.cpu_count()} cores, load average now {os.getloadavg()[0]:.1f}"
    )
    print(f"{'configuration':<26}" + "".join(f" | {d:>6g} ms" for d in delays))
    for name, _ in configs:
        print(f"{name:<26}" + "".join(f" | {table[d][name] or 0:>9,.0f}" for d in delays))
    all_met = True
    for delay in delays:
        rates = {k: v for k, v in table[delay].items() if v}
        default = table[delay]["defaults"]
        best_name = max(rates, key=rates.get) if rates else "defaults"
        best = rates.get(best_name)
        met = bool(default and best and default >= 0.9 * best)
        all_met &= met
        share = f"{default / best:.0%}" if default and best else "n/a"
        print(
            f"{delay:>3g} ms: defaults {default or 0:,.0f}/s = {share} of the best ({best_name}, "
            f"{best or 0:,.0f}/s): {'met' if met else 'NOT met'} (target: within 10 %)"
        )
        record(
            f"defaults vs hand-tuned, newsletter over SMTP, relay {delay:g} ms",
            "mails/s at defaults",
            default or 0.0,
            "mails/s",
            baseline=best,
            baseline_label=f"best hand-tuned ({best_name})",
            target="defaults within 10 % of the best hand-tuned setting",
            met=met,
            recipients=args.recipients,
            table=dict(table[delay].items()),
        )
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
