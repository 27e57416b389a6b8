"""SMTP client CPU per mail: why the SMTP provider drives its connections with its own small asyncio
client (app/platform/providers/smtp_async.py) instead of smtplib threads or aiosmtplib.

    .venv/bin/python scripts/bench/smtp_client.py [--mails 6000] [--connections 50] [--delay-ms 0]

Sends the same built mails to the loopback benchmark sink over N connections with:
  ours        SMTPProvider, asyncio client (the default, SMTP_ASYNC=1; PIPELINING)
  smtplib     SMTPProvider with SMTP_ASYNC=0: smtplib, a thread per connection
  aiosmtplib  the library, on uvloop, one task per connection (only if it is installed:
              `pip install aiosmtplib`; it is not a project dependency)
and prints the client's CPU per mail and mails/s. CPU per mail is what limits digests/s on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--mails", type=int, default=6000)
p.add_argument("--connections", type=int, default=50)
p.add_argument("--delay-ms", type=float, default=0.0, help="the sink's delay per message")
p.add_argument("--port", type=int, default=2599)
args = p.parse_args()

from app.platform import config, mail  # noqa: E402
from app.platform.providers.base import OutgoingMail  # noqa: E402
from app.platform.providers.smtp import SMTPProvider  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
URL = f"smtp://127.0.0.1:{args.port}"
MAILS = [
    OutgoingMail(
        to=f"user{i}@example.test",
        subject="Your daily digest",
        html="<p>hello</p>" * 200,
        text="hello\n" * 200,
        idempotency_key=f"bench-{i}",
    )
    for i in range(args.mails)
]


def measure(send) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    send()
    return (time.process_time() - cpu) / len(MAILS) * 1e6, len(MAILS) / (time.perf_counter() - started)


def provider(use_async: bool):
    prov = SMTPProvider(URL, pool_size=args.connections, use_async=use_async)
    prov._latency = 1.0  # smtplib lanes: use every connection, as at a 50 ms round trip
    prov.send_batch(MAILS[: args.connections])  # open the connections first
    return prov


def send_with(prov):
    step = prov.max_batch  # what the digest and newsletter senders hand over per call
    results = [r for start in range(0, len(MAILS), step) for r in prov.send_batch(MAILS[start : start + step])]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]


def aiosmtplib_run():
    import aiosmtplib

    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()

    async def lane(k: int):
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=args.port, start_tls=False)
        await client.connect()
        for m in MAILS[k :: args.connections]:
            await client.sendmail("bench@example.test", [m.to], mail.build(m))
        await client.quit()

    async def all_lanes():
        await asyncio.gather(*(lane(k) for k in range(args.connections)))

    return lambda: loop.run_until_complete(all_lanes())


def main() -> int:
    sink = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts/bench/smtp_sink.py"),
            "--port",
            str(args.port),
            "--delay-ms",
            str(args.delay_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if "ready" not in sink.stdout.readline():
            sys.exit("sink did not start")
        print(
            f"smtp client bench: {args.mails} mails over {args.connections} connections, sink delay "
            f"{args.delay_ms:.0f} ms; client CPU per mail (mail building included for every client)"
        )
        results = {}
        for name, use_async in (("ours", True), ("smtplib", False)):
            prov = provider(use_async)
            results[name] = cpu, rate = measure(lambda: send_with(prov))
            prov.close()
            print(f"  {name:<11} {cpu:6.0f} us CPU/mail  {rate:8.0f} mails/s")
        try:
            send = aiosmtplib_run()
        except ImportError:
            print("  aiosmtplib  not installed (pip install aiosmtplib to compare)")
        else:
            results["aiosmtplib"] = cpu, rate = measure(send)
            print(f"  {'aiosmtplib':<11} {cpu:6.0f} us CPU/mail  {rate:8.0f} mails/s")
    finally:
        sink.terminate()
    record_results(results)
    return 0


def record_results(results: dict) -> None:
    """The figures for BENCHMARKS.md (scripts/bench/report.py); aiosmtplib, when installed, in the details."""
    bench = f"SMTP client, relay {args.delay_ms:g} ms"
    peer = results.get("aiosmtplib")
    for figure, col, unit, higher in (("client CPU per mail", 0, "µs", False), ("mails/s", 1, "mails/s", True)):
        record(
            bench,
            figure,
            results["ours"][col],
            unit,
            baseline=results["smtplib"][col],
            baseline_label="smtplib, a thread per connection",
            higher_is_better=higher,
            mails=args.mails,
            connections=args.connections,
            delay_ms=args.delay_ms,
            aiosmtplib=round(peer[col], 1) if peer else "not installed",
        )


if __name__ == "__main__":
    sys.exit(main())
