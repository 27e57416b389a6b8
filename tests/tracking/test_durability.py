"""The documented loss window of click history, against a real uvicorn process.

Contract (tracking/recorder.py, tracking/README.md): a click's history row is committed at most
TRACKING_FLUSH_SECONDS after its redirect was sent. SIGTERM (deploys, dyno restarts) flushes
everything; only a SIGKILL/crash loses rows, and only those of the last window.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.platform import config, db
from tracking import links

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(flush_seconds: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": config.get().database_url,
        "APP_ENV": "test",
        "TRACKING_FLUSH_SECONDS": str(flush_seconds),
        "BASE_URL": "http://localhost:8000",
        "LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.web:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/openapi.json", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("web process did not start")
        time.sleep(0.05)


def click_paths(n_links: int) -> list[str]:
    html = "".join(f'<a href="https://example.com/{i}">{i}</a>' for i in range(n_links))
    out = links.LinkRewriter("newsletter", 1).rewrite(html, 5)
    return ["/c/" + part.split('"', 1)[0] for part in out.split("/c/")[1:]]


def click(base: str, paths: list[str], n: int) -> None:
    with httpx.Client(base_url=base, timeout=10) as c:
        for i in range(n):
            r = c.get(paths[i % len(paths)], headers={"User-Agent": "Mozilla/5.0 (X11) Firefox/130.0"})
            assert r.status_code == 302


def history_count() -> int:
    return db.query("SELECT count(*) FROM email_link_history WHERE kind = 'click'")[0][0]


def test_sigterm_flushes_every_click_even_with_a_long_window():
    paths = click_paths(3)
    proc, base = start_web(flush_seconds=3600)
    try:
        click(base, paths, 40)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) is not None
    assert history_count() == 40


def test_sigkill_after_the_window_loses_nothing():
    window = 0.2
    paths = click_paths(3)
    proc, base = start_web(flush_seconds=window)
    try:
        click(base, paths, 60)
        time.sleep(window + 1.5)  # let the window pass; commit takes milliseconds
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert history_count() == 60


def test_sigkill_inside_the_window_loses_at_most_that_window():
    """What the window means: with a (deliberately huge) window, a SIGKILL loses the buffered
    clicks — the redirects were all served, the statistic is what is lost."""
    paths = click_paths(2)
    proc, base = start_web(flush_seconds=3600)
    try:
        click(base, paths, 25)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert history_count() == 0
