"""`make bench`: run every benchmark once and write one report — BENCHMARKS.md, docs/benchmarks.json and
docs/benchmarks.png — with every figure beside its target and the baseline or peer measured in the
same run, the machine's facts (cores, memory, load average before and after, versions) and one chart:
throughput against worker processes (the scaling curve docs/scaling.md discusses).

    .venv/bin/python scripts/bench/report.py              # everything (about two hours on 2 cores: the soak is one)
    .venv/bin/python scripts/bench/report.py --quick      # small sizes: checks the report end to end
    .venv/bin/python scripts/bench/report.py --only digest,peer-0ms
    .venv/bin/python scripts/bench/report.py --keep --results soak=/tmp/soak.jsonl   # a run made on its own

Each step is a bench script run as a subprocess with BENCH_RESULTS pointing at its own file
(scripts/bench/shared.record writes one JSON line per figure); its output goes to
.var/bench/logs/<step>.log. A failed or timed-out step is reported as such, and the rest still run.
Re-running replaces the three files. CI never runs it: the figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.bench.shared import read_records  # noqa: E402

REPORT = ROOT / "BENCHMARKS.md"
JSON_OUT = ROOT / "docs" / "benchmarks.json"
CHART = ROOT / "docs" / "benchmarks.png"
LOGS = ROOT / ".var" / "bench" / "logs"
SCALING_PROCESSES = (1, 2, 4, 8)


@dataclass
class Step:
    name: str
    argv: list[str]
    quick: list[str] = field(default_factory=list)  # replaces the size arguments under --quick
    timeout: float = 1800.0
    group: str = "other"  # "scaling" steps feed the chart


def bench(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "bench" / script), *args]


def steps() -> list[Step]:
    out = [
        Step("ingest", bench("ingest.py"), ["--seconds", "3"]),
        Step("digest", bench("digest.py"), ["--subscribers", "1500", "--baseline-subscribers", "200"]),
        Step("planner", bench("planner.py"), ["--subscribers", "50000"]),
        Step("render", bench("render.py")),
        Step("locales", bench("locales.py"), ["--rounds", "4", "--digests", "100"]),
        Step("validation", bench("validation.py")),
        Step("tokens", bench("tokens.py")),
        Step("feed", bench("feed.py"), ["--noise", "20000", "--requests", "50"]),
        Step("digest-seen", bench("digest_seen.py"), ["--subscribers", "1000", "--rounds", "2"]),
        Step("feed-stream", bench("feed_stream.py"), ["--streams", "50", "--events", "50", "--seconds", "3"]),
        Step("migrations", bench("migrations.py"), ["--hold", "2", "--repeat", "1"]),
        Step(
            "partition-migration",
            bench("partition_migration.py"),
            ["--rows", "300000", "--warmup", "3", "--after", "3"],
        ),
        Step("event-insert", bench("event_insert.py"), ["--rounds", "10"]),
        Step("soak", bench("soak.py"), ["--minutes", "2", "--sample", "10"], timeout=4500.0),
        Step("digest-mark", bench("digest_mark.py"), ["--subscribers", "100", "--history", "40", "--rounds", "3"]),
        Step("groupcommit", bench("groupcommit.py"), ["--seconds", "2"]),
        Step("ratelimit", bench("ratelimit.py")),
        Step("smtp-client", bench("smtp_client.py"), ["--mails", "1000"]),
        # SendGrid (beside its naive baseline), SES, Postmark and Mailgun at 0 and 50 ms, and the failover switch
        Step(
            "newsletter-providers",
            bench("newsletter.py"),
            ["--recipients", "5000", "--baseline-sample", "300", "--failover-trials", "3"],
        ),
        Step("peer-0ms", bench("peer_postoffice.py", "--smtp-delay-ms", "0"), ["--recipients", "2000"]),
        Step(
            "peer-50ms",
            bench("peer_postoffice.py", "--smtp-delay-ms", "50", "--recipients", "5000"),
            ["--recipients", "1000"],
        ),
        Step(
            "newsletter-1m-smtp",
            bench(
                "peer_postoffice.py",
                "--skip-peer",
                "--recipients",
                "1000000",
                "--label",
                "newsletter over SMTP, 1,000,000 recipients, relay 0 ms",
            ),
            ["--recipients", "20000"],
            timeout=3600,
        ),
        # The knobs that moved the figures most in a full sweep (`knobs.py` alone sweeps them all).
        # Best of 2 per configuration: one run each put the same defaults at 82 % and at 100 % of the
        # best at 50 ms in two runs an hour apart.
        Step(
            "knobs",
            bench(
                "knobs.py",
                "--repeat",
                "2",
                "--only",
                "SMTP_POOL_SIZE=32,SEND_BATCH_SIZE=100,NEWSLETTER_SEND_CHAINS=8,no chain growth",
            ),
            ["--recipients", "2000"],
            timeout=3600,
        ),
        Step("click", bench("click.py"), ["--seconds", "3", "--baseline-seconds", "2"]),
        Step("webhook", bench("webhook.py")),
        Step("admin-dashboard", bench("admin_dashboard.py"), ["--per-day", "5000", "--days", "7"]),
        Step("hold-release", bench("hold_release.py"), ["--subscribers", "5000"], timeout=3600),
        # issue 40: what quiet hours and the mail budget add to the digest and newsletter benchmarks
        Step(
            "quiet-budget",
            bench("quiet_budget.py"),
            ["--rounds", "1", "--subscribers", "1000", "--recipients", "2000"],
            timeout=3600,
        ),
        # docs/scaling.md's model past one host: N worker processes under a CPU quota each, one Postgres
        Step(
            "scaling-sim",
            bench("scaling_sim.py"),
            ["--hosts", "1,2,4", "--seconds", "2", "--calibrate", "1000"],
            timeout=1800,
        ),
    ]
    for p in SCALING_PROCESSES:
        out.append(
            Step(
                f"scaling-digest-{p}p",
                bench("digest.py", "--no-baseline", "--delays", "0", "--processes", str(p), "--subscribers", "8000"),
                ["--subscribers", "800"],
                group="scaling",
            )
        )
        out.append(
            Step(
                f"scaling-newsletter-{p}p",
                bench(
                    "peer_postoffice.py",
                    "--skip-peer",
                    "--recipients",
                    "30000",
                    "--worker-processes",
                    str(p),
                    "--label",
                    f"scaling: newsletter, {p} worker processes",
                ),
                ["--recipients", "3000"],
                group="scaling",
            )
        )
    return out


def with_quick(argv: list[str], quick: list[str]) -> list[str]:
    """argv with each `--flag value` of `quick` replacing the same flag's value (or appended)."""
    argv = list(argv)
    for flag, value in zip(quick[::2], quick[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def run_step(step: Step, quick: bool) -> dict:
    LOGS.mkdir(parents=True, exist_ok=True)
    results = LOGS / f"{step.name}.jsonl"
    results.unlink(missing_ok=True)
    argv = with_quick(step.argv, step.quick) if quick else step.argv
    env = {**os.environ, "BENCH_RESULTS": str(results), "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    shown = " ".join(Path(a).name if a.endswith(".py") else a for a in argv[1:])
    print(f"[{time.strftime('%H:%M:%S')}] {step.name}: {shown}", flush=True)
    with open(LOGS / f"{step.name}.log", "w") as log:
        # Its own process group: on a timeout the bench gets SIGINT (its cleanup stops the workers
        # and sinks it started), then the whole group SIGKILL, so nothing is left consuming Redis.
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=step.timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    figures = read_records(results)
    seconds = time.monotonic() - started
    print(f"    exit {rc}, {len(figures)} figures, {seconds:.0f} s", flush=True)
    return {
        "step": step.name,
        "group": step.group,
        "argv": argv[1:],
        "exit": rc,
        "seconds": seconds,
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "figures": figures,
    }


def standalone_step(step: Step, results: Path) -> dict:
    """A step whose script ran on its own (BENCH_RESULTS=results): its figures, when the file was
    last written, and how long it ran if a figure says (details `minutes`)."""
    figures = read_records(results)
    minutes = max((float(f["details"].get("minutes", 0)) for f in figures), default=0.0)
    return {
        "step": step.name,
        "group": step.group,
        "argv": step.argv[1:],
        "exit": "standalone",
        "seconds": minutes * 60,
        "finished": datetime.fromtimestamp(results.stat().st_mtime, UTC).strftime("%Y-%m-%d %H:%M"),
        "load_before": None,
        "load_after": None,
        "figures": figures,
    }


# -- machine facts


def command_output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_facts() -> dict:
    from importlib import metadata

    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")
    )
    versions = {}
    for dist in (
        "starlette",
        "uvicorn",
        "dramatiq",
        "peewee",
        "psycopg2-binary",
        "redis",
        "chevron",
        "pydantic",
        "aiosmtpd",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    from app.platform import config

    try:
        import psycopg2

        server = urlparse(config.get().database_url)._replace(path="/postgres").geturl()  # any database will do
        with psycopg2.connect(server, connect_timeout=5) as conn, conn.cursor() as cur:
            cur.execute("SHOW server_version")
            postgres = cur.fetchone()[0]
    except Exception as exc:  # the report still says what it could find
        postgres = f"unknown ({exc.__class__.__name__})"
    redis_info = command_output(["redis-cli", "-u", config.get().redis_url, "INFO", "server"])
    redis_version = next(
        (line.split(":", 1)[1] for line in redis_info.splitlines() if line.startswith("redis_version:")), ""
    )
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": postgres,
        "redis": redis_version.strip(),
        "packages": versions,
        "commit": command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "dirty": bool(command_output(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])),
    }


# -- the report


def fmt(value, unit: str) -> str:
    if value is None:
        return "–"
    if unit in ("s", "ms", "us", "MB") or abs(value) < 100:
        text = f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}"
    else:
        text = f"{value:,.0f}"
    return f"{text} {unit}".strip()


def verdict(figure: dict) -> str:
    if figure["met"] is None:
        return ""
    return "met" if figure["met"] else "**not met**"


def markdown(run: dict) -> str:
    m = run["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` (scripts/bench/report.py) on {run['finished']} from commit `{m['commit']}`"
        f"{' with local changes' if m['dirty'] else ''}"
        f"{' — QUICK mode: small sizes, not for quoting' if run['quick'] else ''}."
        " Every figure stands beside its target and the baseline or peer measured in the same run;"
        " re-running replaces this file, docs/benchmarks.json and docs/benchmarks.png.",
        "",
        "## Machine",
        "",
        f"- {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Linux {m['kernel']}",
        f"- Python {m['python']}, PostgreSQL {m['postgres']}, Redis {m['redis']}",
        "- " + ", ".join(f"{k} {v}" for k, v in m["packages"].items()),
        (
            "- steps from several invocations (`--keep`): each step's load average and time are under Steps."
            if run.get("kept")
            else f"- load average (1 min) before {run['load_before']:.2f}, after {run['load_after']:.2f};"
            f" total {run['seconds'] / 60:.0f} min."
        )
        + " Everything ran on this machine over 127.0.0.1: the relay/ESP"
        " sinks, Postgres and Redis share the same cores as the service.",
        "",
        "## Figures",
        "",
        "| benchmark | figure | ours | baseline / peer (same run) | ratio | target | |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in run["steps"]:
        if step["group"] == "scaling":
            continue
        if not step["figures"]:
            lines.append(
                f"| {step['step']} | (no figures: exit {step['exit']}, see .var/bench/logs/{step['step']}.log)"
                " | | | | | |"
            )
        for f in step["figures"]:
            base = f"{fmt(f['baseline'], f['unit'])} ({f['baseline_label']})" if f["baseline"] is not None else ""
            ratio = f"{f['ratio']:.2f}×" if f["ratio"] else ""
            lines.append(
                f"| {f['bench']} | {f['figure']} | {fmt(f['value'], f['unit'])} | {base} | {ratio} | "
                f"{f['target']} | {verdict(f)} |"
            )
    lines += [
        "",
        "## Scaling with worker processes",
        "",
        "Digests (tracking on, relay 0 ms) and newsletter mails over SMTP (relay 0 ms) per second against"
        " `WORKER_PROCESSES`, each point one run of scripts/bench/digest.py `--no-baseline` resp."
        " scripts/bench/peer_postoffice.py `--skip-peer`; what limits each point is in docs/scaling.md.",
        "",
        "![throughput against worker processes](docs/benchmarks.png)",
        "",
        "| worker processes | digests/s | CPU ms per digest (workers / postgres) | newsletter mails/s |",
        "|---|---|---|---|",
    ]
    curve = scaling_curve(run)
    for p in SCALING_PROCESSES:
        d, n = curve["digest"].get(p), curve["newsletter"].get(p)
        cpu = curve["digest_cpu"].get(p)
        cpu_text = f"{cpu['workers']:.2f} / {cpu['postgres']:.2f}" if cpu else "–"
        lines.append(f"| {p} | {fmt(d, '')} | {cpu_text} | {fmt(n, '')} |")
    lines += [
        "",
        "## Steps",
        "",
        "| step | command | exit | minutes | load before → after | finished (UTC) |",
        "|---|---|---|---|---|---|",
    ]
    for step in run["steps"]:
        command = " ".join(Path(a).name if a.endswith(".py") else a for a in step["argv"])
        load = (
            f"{step['load_before']:.1f} → {step['load_after']:.1f}"
            if step["load_before"] is not None
            else "run on its own"
        )
        lines.append(
            f"| {step['step']} | `{command}` | {step['exit']} | {step['seconds'] / 60:.1f} | "
            f"{load} | {step.get('finished', '')} |"
        )
    lines += ["", "Logs of each step: `.var/bench/logs/<step>.log` (not committed).", ""]
    return "\n".join(lines)


def scaling_curve(run: dict) -> dict:
    curve = {"digest": {}, "digest_cpu": {}, "newsletter": {}}
    for step in run["steps"]:
        if step["group"] != "scaling":
            continue
        for f in step["figures"]:
            p = f["details"].get("processes")
            if f["figure"] == "digests/s" and p:
                curve["digest"][p] = f["value"]
            elif f["figure"].startswith("CPU per digest") and p:
                curve["digest_cpu"][p] = {
                    "workers": f["details"].get("workers_ms", 0.0),
                    "postgres": f["details"].get("postgres_ms", 0.0),
                }
            elif f["figure"] == "mails/s" and p:
                curve["newsletter"][p] = f["value"]
    return curve


def chart(run: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = scaling_curve(run)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for key, label, marker in (
        ("digest", "digests/s (tracking on)", "o"),
        ("newsletter", "newsletter mails/s over SMTP", "s"),
    ):
        points = sorted(curve[key].items())
        if points:
            ax.plot([p for p, _ in points], [v for _, v in points], marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(SCALING_PROCESSES), [str(p) for p in SCALING_PROCESSES])
    ax.set_xlabel("worker processes (WORKER_PROCESSES)")
    ax.set_ylabel("per second")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    m = run["machine"]
    ax.set_title(
        f"Throughput against worker processes — {m['cores']} cores, relay 0 ms, all on one machine", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    CHART.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(CHART)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes: checks the report, figures not for quoting")
    p.add_argument("--only", default="", help="comma-separated step names (see the list in --list)")
    p.add_argument("--list", action="store_true", help="print the steps and exit")
    p.add_argument(
        "--results",
        action="append",
        default=[],
        metavar="STEP=FILE",
        help="with --keep: STEP's figures from FILE, written by its script run on its own with BENCH_RESULTS=FILE "
        "(for a long step such as the soak), instead of running it",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="with --only: keep the other steps' results from the last report (each step says when it ran)",
    )
    args = p.parse_args()
    all_steps = steps()
    if args.list:
        for step in all_steps:
            print(f"{step.name:<24} {' '.join(step.argv[1:])}")
        return 0
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = wanted - {s.name for s in all_steps}
    if unknown:
        p.error(f"unknown steps: {', '.join(sorted(unknown))} (see --list)")
    from_files = {spec.partition("=")[0] for spec in args.results}
    chosen = [s for s in all_steps if (s.name in wanted or not (wanted or from_files)) and s.name not in from_files]
    os.environ.setdefault("APP_ENV", "development")
    run = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine_facts(),
        "load_before": os.getloadavg()[0],
    }
    started = time.monotonic()
    run["steps"] = [run_step(step, args.quick) for step in chosen]
    by_name = {s.name: s for s in all_steps}
    for spec in args.results:
        name, _, path = spec.partition("=")
        if name not in by_name or not path or not args.keep:
            p.error(f"--results {spec}: STEP=FILE with a step from --list, and --keep")
        run["steps"].append(standalone_step(by_name[name], Path(path)))
    if args.keep and JSON_OUT.exists():
        previous = json.loads(JSON_OUT.read_text())
        fresh = {s["step"]: s for s in run["steps"]}
        order = [s.name for s in all_steps]
        kept = [s for s in previous.get("steps", []) if s["step"] not in fresh]
        run["kept"] = bool(kept)
        run["steps"] = sorted(
            [*kept, *fresh.values()], key=lambda s: order.index(s["step"]) if s["step"] in order else len(order)
        )
    run.update(
        finished=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load_after=os.getloadavg()[0],
        seconds=time.monotonic() - started,
    )
    JSON_OUT.parent.mkdir(parents=True, exist_ok=True)
    JSON_OUT.write_text(json.dumps(run, indent=1, default=str) + "\n")
    chart(run)
    REPORT.write_text(markdown(run))
    failed = [s["step"] for s in run["steps"] if s["exit"] not in (0, "standalone")]
    missed = [f"{f['bench']}: {f['figure']}" for s in run["steps"] for f in s["figures"] if f["met"] is False]
    print(f"wrote {REPORT.relative_to(ROOT)}, {JSON_OUT.relative_to(ROOT)}, {CHART.relative_to(ROOT)}")
    if failed:
        print(f"steps that failed: {', '.join(failed)} (logs in {LOGS.relative_to(ROOT)})")
    if missed:
        print("targets not met:\n  " + "\n  ".join(missed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
