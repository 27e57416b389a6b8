"""With SENTRY_DSN set, the web app and the workers report errors (to a local fake Sentry)."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import textwrap
import threading

import pytest


class FakeSentry(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        FakeSentry.received.append(body.decode("utf-8", "replace"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def sentry_dsn():
    FakeSentry.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSentry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://publickey@127.0.0.1:{server.server_address[1]}/1"
    server.shutdown()


def run(code: str, dsn: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SENTRY_DSN": dsn}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_web_errors_reach_sentry(sentry_dsn):
    proc = run(
        """
        import sentry_sdk
        from starlette.routing import Route
        from starlette.testclient import TestClient
        from app.web import create_app

        def boom(request):
            raise ZeroDivisionError("web-boom")

        app = create_app()
        app.router.routes.append(Route("/boom", boom))
        with TestClient(app, raise_server_exceptions=False) as c:
            assert c.get("/boom").status_code == 500
        sentry_sdk.flush(10)
    """,
        sentry_dsn,
    )
    assert proc.returncode == 0, proc.stderr
    assert any("web-boom" in body for body in FakeSentry.received)


def test_worker_errors_reach_sentry(sentry_dsn, redis_client):
    proc = run(
        """
        import time
        import dramatiq, sentry_sdk
        import actors  # Sentry first, then the broker (actors/broker.py)
        from dramatiq import Worker

        @dramatiq.actor(max_retries=0, queue_name="sentry_test")
        def explode():
            raise RuntimeError("worker-boom")

        broker = actors.broker
        broker.flush("sentry_test")
        explode.send()
        worker = Worker(broker, worker_threads=1, worker_timeout=100)
        worker.start()
        broker.join("sentry_test", timeout=20000)
        worker.join()
        worker.stop()
        sentry_sdk.flush(10)
    """,
        sentry_dsn,
    )
    assert proc.returncode == 0, proc.stderr
    assert any("worker-boom" in body for body in FakeSentry.received)
