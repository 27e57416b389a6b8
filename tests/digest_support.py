"""Shared helpers for the digest, scheduler, mail and provider tests (no tests here; rows: tests/factories.py).

SmtpSink is a real SMTP server (aiosmtpd) on 127.0.0.1 started by the test; it can answer with an
error code instead of 250 to exercise transient/permanent failures, for every mail (`reply`) or for
one recipient (`reject_rcpt` at RCPT, `reject_data` at the end of DATA), and cap the connections
open at once like a stock Postfix (`max_connections`: beyond it the greeting is `421 4.7.0 Error:
too many connections from ...` and the connection is closed). It counts connections: accepted,
refused, open now and the most open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import socket
import threading
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP

from app.platform import db, providers
from digest import marks as digest_marks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler:
    def __init__(self, sink):
        self.sink = sink

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        session.host_name = hostname
        if self.sink.pipelining:  # aiosmtpd reads commands line by line, so it copes with pipelining
            responses.insert(1, "250-PIPELINING")
        return responses

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address in self.sink.reject_rcpt:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.sink.data_at.append(time.monotonic())  # when the client had handed this mail over
        if self.sink.delay:
            await asyncio.sleep(self.sink.delay)  # a relay's round trip
        with self.sink.lock:
            self.sink.sessions.add(id(session))
            reply = next(
                (self.sink.reject_data[r] for r in envelope.rcpt_tos if r in self.sink.reject_data), self.sink.reply
            )
            if reply.startswith("250"):
                self.sink.raw.append(envelope.content)
                self.sink.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
            held = self.sink.hold_after is not None and len(self.sink.raw) > self.sink.hold_after
        if held:  # taken, but the client never hears so: the mail is delivered and unrecorded
            await self.sink.released.wait()
        return reply


class _CountingSMTP(SMTP):
    """aiosmtpd's server, counting connections and refusing those above the sink's cap as Postfix
    does (smtpd_client_connection_count_limit: the 421 greeting, then close)."""

    def __init__(self, sink, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sink, self._counted = sink, False

    async def _handle_client(self):
        sink = self._sink
        with sink.lock:
            refuse = sink.max_connections is not None and sink.open_connections >= sink.max_connections
            if refuse:
                sink.refused += 1
            else:
                self._counted = True
                sink.connections += 1
                sink.open_connections += 1
                sink.peak_connections = max(sink.peak_connections, sink.open_connections)
        if refuse:
            await self.push("421 4.7.0 Error: too many connections from 127.0.0.1")
            self.transport.close()
            return
        await super()._handle_client()

    def connection_lost(self, error):
        if self._counted:
            self._counted = False
            with self._sink.lock:
                self._sink.open_connections -= 1
        super().connection_lost(error)


class _Controller(Controller):
    def __init__(self, sink, *args, **kwargs):
        self._sink = sink
        super().__init__(*args, **kwargs)

    def factory(self):
        return _CountingSMTP(self._sink, self.handler, **self.SMTP_kwargs)


class SmtpSink:
    def __init__(
        self, port: int | None = None, pipelining: bool = True, max_connections: int | None = None, **controller_kwargs
    ):
        self.raw: list[bytes] = []
        self.envelopes = []
        self.sessions = set()  # distinct SMTP connections that sent mail
        self.pipelining = pipelining
        self.reject_rcpt: set[str] = set()
        self.reject_data: dict[str, str] = {}  # recipient -> reply to the end of DATA (e.g. a 554)
        self.reply = "250 OK"
        self.delay = 0.0  # seconds before answering DATA
        self.hold_after: int | None = None  # mails past this many are taken but left unanswered
        self.released = asyncio.Event()  # (set on the sink's loop) answers the held ones
        self.data_at: list[float] = []  # time.monotonic() of every message's DATA, refused ones too
        self.max_connections = max_connections  # None: no cap
        self.connections = 0  # accepted so far
        self.refused = 0  # answered 421 (over the cap)
        self.open_connections = 0
        self.peak_connections = 0
        self.lock = threading.Lock()
        self.port = port or free_port()
        self.controller = _Controller(self, _Handler(self), hostname="127.0.0.1", port=self.port, **controller_kwargs)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def start(self):
        self.controller.start()
        return self

    def stop(self):
        self.controller.stop()

    def release(self) -> None:
        """Answer the held mails and hold no more."""
        self.hold_after = None
        self.controller.loop.call_soon_threadsafe(self.released.set)

    def messages(self):
        with self.lock:
            return [email.message_from_bytes(r, policy=email.policy.default) for r in self.raw]


def run_row(run_id) -> dict:
    cols = (
        "id",
        "status",
        "attempts",
        "event_count",
        "last_error",
        "skip_reason",
        "provider_message_id",
        "next_attempt_at",
        "enqueued_at",
        "claimed_at",
        "completed_at",
        "cadence",
        "period",
        "scheduled_for",
    )
    row = db.query(f"SELECT {', '.join(cols)} FROM digest_runs WHERE id = %s", (run_id,))[0]
    return dict(zip(cols, row))


def marked(event_ids) -> dict:
    """{event id: the run that handled it, or None} (digest/marks.py)."""
    return digest_marks.handled_by(event_ids)


@contextlib.contextmanager
def sink_as_provider(settings, **overrides):
    """A recording SMTP sink that the service sends to (MAIL_PROVIDER=smtp, tracking off), closed
    with the pooled provider connections afterwards. For the tests' `sink` fixtures."""
    s = SmtpSink().start()
    settings(**{"mail_provider": "smtp", "smtp_url": s.url, "smtp_pool_size": 4, "tracking": False, **overrides})
    try:
        yield s
    finally:
        providers.close_all()
        s.stop()
