"""Clients that hold a connection without finishing their request (issue 25, item 8), and clients that
go away mid-request: a real uvicorn on 127.0.0.1 and raw sockets, real Postgres and Redis.

No assertion is about time: a test waits (bounded) for what the server does, and a pause in a test
only makes sure the server's deadline has passed before the next step."""

from __future__ import annotations

import logging
import re
import select
import socket
import threading
import time
from pathlib import Path

import pytest

from app.platform import apikeys, tokens
from tests import factories
from tests.conftest import wait_for
from tests.raw_http import closed_by_server, connect

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = "app.platform.slow_clients:HeaderDeadlineHttpTools"


@pytest.fixture
def deadline_server(settings):
    """The app under uvicorn with the Procfile's protocol and a short header deadline (0.5 s), a
    long keep-alive (60 s), in a thread; yields its base URL."""
    import uvicorn

    from app.web import app

    settings(http_header_timeout_seconds=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", http=PROTOCOL, timeout_keep_alive=60
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 15, "the server to start")
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body (what these endpoints send)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_the_procfiles_web_commands_use_the_header_deadline():
    for procfile in ("Procfile", "Procfile.dev"):
        web = next(line for line in (ROOT / procfile).read_text().splitlines() if line.startswith("web:"))
        assert f"--http {PROTOCOL}" in web, procfile


def test_a_client_trickling_header_bytes_is_answered_408_and_closed(deadline_server):
    with connect(deadline_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = b""
        for _ in range(600):  # a byte every 0.1 s, for at most a minute: the server must end it
            if select.select([sock], [], [], 0.1)[0]:
                answer = sock.recv(65536)
                break
            sock.sendall(b"a")
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert closed_by_server(sock)


def test_a_connection_that_never_sends_a_byte_is_closed(deadline_server):
    with connect(deadline_server) as sock:
        assert sock.recv(65536).startswith(b"HTTP/1.1 408 ")


def test_headers_sent_in_time_are_not_cut_off_by_a_slow_body_or_an_idle_keep_alive(deadline_server):
    with connect(deadline_server) as sock:
        sock.sendall(b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
        time.sleep(1.0)  # past the header deadline: the body is not under it
        sock.sendall(b"[]")
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.0)  # idle between requests: keep-alive's business, not the deadline's
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


# ---------------------------------------------------------------- clients that go away


class Captured(logging.Handler):
    """Every record of the app's and uvicorn's loggers (uvicorn's do not propagate to the root)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def captured():
    handler = Captured()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    yield handler
    for logger, level in zip(loggers, levels):
        logger.removeHandler(handler)
        logger.setLevel(level)


def half_a_request(base_url: str, head: bytes) -> None:
    """Headers promising 1000 bytes, then 500 of them, then the client hangs up."""
    with connect(base_url) as sock:
        sock.sendall(head + b"Content-Length: 1000\r\n\r\n" + b"a" * 500)


def routes(admin_key: str, preferences_token: str) -> list[tuple[str, bytes]]:
    form = b"Content-Type: application/x-www-form-urlencoded\r\n"
    bearer = b"Authorization: Bearer " + admin_key.encode() + b"\r\nContent-Type: application/json\r\n"
    return [
        ("/webhooks/sendgrid", b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\n"),
        ("/admin/login", b"POST /admin/login HTTP/1.1\r\nHost: x\r\n" + form),
        (
            "/preferences/{token:str}",
            b"POST /preferences/" + preferences_token.encode() + b" HTTP/1.1\r\nHost: x\r\n" + form,
        ),
        ("/v1/events", b"POST /v1/events HTTP/1.1\r\nHost: x\r\n" + bearer),
        ("/v1/subscribers/{user_id:str}", b"PUT /v1/subscribers/u1 HTTP/1.1\r\nHost: x\r\n" + bearer),
    ]


def test_a_client_that_goes_away_mid_request_is_one_info_line(live_server, captured):
    admin_key = apikeys.create("vanishing", "admin")
    token = tokens.make("preferences", factories.subscriber("gone"), 1)
    for route, head in routes(admin_key, token):
        half_a_request(live_server, head)
        line = wait_for(
            lambda: [r for r in captured.records if "client went away" in r.getMessage() and route in r.getMessage()],
            30,
            f"the line for {route}",
        )
        assert len(line) == 1 and line[0].levelno == logging.INFO and line[0].exc_info is None
    noisy = [r for r in captured.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [f"{r.name}: {r.getMessage()}" for r in noisy]
    assert not [r for r in captured.records if token in r.getMessage()]  # the route's template, not the token
