"""A real local HTTP server that speaks enough of SendGrid's v3 mail/send for tests and benchmarks.

It listens on 127.0.0.1 (ephemeral port), parses each request, and records what every recipient
would receive (content with the personalization's substitutions applied). Like a provider that
honours idempotency keys, a personalization whose custom_args idempotency_key was already
accepted is acknowledged but not delivered again; `accepted_keys` counts every acceptance, so
tests can see re-sends, and `delivered` holds each recipient's mail once.

Knobs: `delay` (seconds per call), `throttle_for(seconds)` (429 storm with X-RateLimit-Reset),
`fail_next(n, status)`, `refuse(address)` (400 for requests carrying it, naming the personalization
like SendGrid), `hold()` / `release()` (keep requests waiting, to kill a worker mid-call).
"""

from __future__ import annotations

import collections
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

from app.platform.providers.sendgrid import render_personalization


class FakeSendGrid:
    def __init__(self, delay: float = 0.0, record: bool = True, host: str = "127.0.0.1", port: int = 0):
        self.delay, self.record = delay, record
        self.lock = threading.Lock()
        self.calls = 0
        self.status_counts: collections.Counter = collections.Counter()
        self.personalizations = 0
        self.requests: list[dict] = []
        self.accepted_keys: collections.Counter = collections.Counter()
        self.delivered: dict[str, dict] = {}
        self.auth_headers: set[str] = set()
        self.idempotency_headers: list[str] = []
        self._storm_until = 0.0
        self.refused: set[str] = set()
        self._failures: collections.deque = collections.deque()
        self._held = threading.Event()
        self._release = threading.Event()
        self.arrived = threading.Event()  # set when a held request has arrived
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}/v3/mail/send"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-sendgrid", daemon=True
        )

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self.release()
        self.server.shutdown()
        self.server.server_close()

    # -- knobs -----------------------------------------------------------------------------------
    def throttle_for(self, seconds: float) -> None:
        self._storm_until = time.time() + seconds

    def fail_next(self, n: int, status: int = 500) -> None:
        self._failures.extend([status] * n)

    def hold(self) -> None:
        self._release.clear()
        self._held.set()

    def release(self) -> None:
        self._held.clear()
        self._release.set()

    def refuse(self, address: str) -> None:
        """Answer 400 to any request carrying this recipient, naming its personalization as SendGrid
        does ("personalizations.3.to.0.email")."""
        self.refused.add(address)

    def refused_in(self, payload: dict) -> list[dict]:
        errors = []
        for i, p in enumerate(payload["personalizations"]):
            for j, to in enumerate(p.get("to") or []):
                if to.get("email") in self.refused:
                    errors.append(
                        {"message": "Does not contain a valid address.", "field": f"personalizations.{i}.to.{j}.email"}
                    )
        return errors

    @property
    def delivered_count(self) -> int:
        return len(self.delivered)

    # -- server ----------------------------------------------------------------------------------
    def _decide(self) -> tuple[int, dict]:
        with self.lock:
            self.calls += 1
            if self._failures:
                return self._failures.popleft(), {}
        if time.time() < self._storm_until:
            return 429, {"X-RateLimit-Reset": str(int(self._storm_until) + 1), "X-RateLimit-Limit": "600"}
        return 202, {}

    def _accept(self, payload: dict) -> None:
        with self.lock:
            for i, p in enumerate(payload["personalizations"]):
                key = p.get("custom_args", {}).get("idempotency_key", f"nokey-{self.calls}-{i}")
                self.accepted_keys[key] += 1
                if key not in self.delivered:
                    self.delivered[key] = render_personalization(payload, i) if self.record else {}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = orjson.loads(body)
                    n = len(payload["personalizations"])
                except Exception:
                    return self._answer(400, {"errors": [{"message": "malformed JSON"}]})
                if not 1 <= n <= 1000:
                    return self._answer(400, {"errors": [{"message": "personalizations must have 1-1000 items"}]})
                refused = fake.refused_in(payload)
                if refused:
                    with fake.lock:
                        fake.calls += 1
                        fake.status_counts[400] += 1
                    return self._answer(400, {"errors": refused})
                with fake.lock:
                    fake.auth_headers.add(self.headers.get("Authorization", ""))
                    fake.idempotency_headers.append(self.headers.get("Idempotency-Key", ""))
                    if fake.record:
                        fake.requests.append(payload)
                if fake._held.is_set():
                    fake.arrived.set()
                    fake._release.wait(60)
                if fake.delay:
                    time.sleep(fake.delay)
                status, headers = fake._decide()
                with fake.lock:
                    fake.status_counts[status] += 1
                if status == 202:
                    fake._accept(payload)
                    with fake.lock:
                        fake.personalizations += n
                    return self._answer(202, None, {"X-Message-Id": f"fake-{fake.calls}"})
                return self._answer(status, {"errors": [{"message": f"fake says {status}"}]}, headers)

            def _answer(self, status, body, headers=None):
                data = orjson.dumps(body) if body is not None else b""
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                if data:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                if data:
                    self.wfile.write(data)

        return Handler


def main():  # pragma: no cover - `python -m tests.fake_sendgrid --port N --delay 0.05` for the benchmark
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    fake = FakeSendGrid(delay=args.delay, record=False, port=args.port).start()
    print(fake.url, flush=True)
    try:
        for _line in sys.stdin:  # any line: print counters; EOF: exit
            with fake.lock:
                print(
                    orjson.dumps(
                        {
                            "calls": fake.calls,
                            "personalizations": fake.personalizations,
                            "accepted": sum(fake.accepted_keys.values()),
                            "unique": len(fake.accepted_keys),
                        }
                    ).decode(),
                    flush=True,
                )
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
