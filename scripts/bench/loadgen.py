"""A small keep-alive HTTP/1.1 load generator on asyncio streams (loopback benchmarks only).

httpx costs more CPU per request than the server under test does; on a 2-core machine the client
would be the bottleneck. This client only writes pre-built requests and parses status + length.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def build_request(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return status, body


@dataclass
class LoadResult:
    latencies: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    bodies: list = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def count(self) -> int:
        return len(self.latencies)

    def pct(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed else 0.0


async def run_load(
    port: int, requests, concurrency: int, duration: float, keep_bodies: bool = False, max_requests: int | None = None
) -> LoadResult:
    """`requests(i)` returns the bytes of request i. Runs for `duration` s or `max_requests`."""
    result = LoadResult()
    counter = iter(range(10**12))
    stop_at = time.perf_counter() + duration

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop_at:
                i = next(counter)
                if max_requests is not None and i >= max_requests:
                    return
                t0 = time.perf_counter()
                writer.write(requests(i))
                status, body = await _read_response(reader)
                result.latencies.append(time.perf_counter() - t0)
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if keep_bodies:
                    result.bodies.append(body)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed = time.perf_counter() - started
    return result


# The service runs with the Procfile's protocol (httptools plus a header deadline); baselines with httptools.
SERVICE_HTTP = {"app.web:app": "app.platform.slow_clients:HeaderDeadlineHttpTools"}


def start_server(app: str, port: int, env: dict, workers: int = 1, app_dir: str | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        SERVICE_HTTP.get(app, "httptools"),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    if app_dir:
        cmd += ["--app-dir", app_dir]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server {app} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server {app} did not start")
