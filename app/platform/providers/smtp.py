"""SMTP provider: real smtplib over a small, thread-safe pool of open connections.

SMTP_URL:  smtp://[user:pass@]host[:port][?starttls=1]   plain, STARTTLS when starttls=1
           smtps://[user:pass@]host[:port]               implicit TLS (port 465 by default)
           ?insecure=1 skips certificate checks (a local relay with a self-signed certificate)

A batch is spread over the worker process's pool of connections sending in parallel; each
connection stays open for the next batch, until it has been idle SMTP_IDLE_TIMEOUT_SECONDS. With a
50 ms round trip per message a single connection caps at 20 mails/s, so throughput comes from
several connections, not from one. By default all connections are driven by one asyncio event loop
thread (app/platform/providers/smtp_async.py: ~70 us less CPU per mail than a thread per connection at
50 ms), SMTP_POOL_SIZE of them and more, up to SMTP_POOL_MAX, only while more raise the measured
throughput (app/platform/providers/smtp_sizing.py); SMTP_ASYNC=0 uses smtplib with a thread per connection,
as many as the measured latency calls for up to SMTP_POOL_SIZE (one, inline, for a fast local
relay). Both use PIPELINING (RFC 2920) when the server offers it: two round trips per mail instead
of four (the asyncio pool: one, the next mail's envelope going out with this one's data), and both
stop below a connection limit the relay enforces (a 421 at the greeting, a refused connect) and
keep below it: the lane it refused waits for one of the pool's connections.

Error mapping: a 5xx reply is permanent for that mail (SendResult.permanent); 4xx replies,
timeouts and dropped connections are transient (the caller retries with the same idempotency key).
A dropped idle connection is reopened once before a mail counts as failed. Credentials the server
rejects raise PermanentError (every mail would fail the same way).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import smtplib
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast
from urllib.parse import parse_qs, unquote, urlparse

from app.platform import config, mail
from app.platform.providers.base import OutgoingMail, PermanentError, Progress, Provider, SendResult, TransientError
from app.platform.providers.smtp_async import BATCH_OUT_OF_TIME, AsyncSender, Reported, not_started
from app.platform.providers.smtp_sizing import CONNECT_BURST, RelayCeiling, RelayRefused, refuses_connections

log = logging.getLogger("app.platform.providers.smtp")

BATCH_TIMEOUTS = 2  # a batch starts no mail after 2 x SMTP_TIMEOUT_SECONDS (60 s by default)
LANE_TARGET_SECONDS = 0.025  # threads: lanes enough that a batch's share per connection takes about this
_LEADING_DOT = re.compile(rb"(?m)^\.")
_DISCONNECTS = (smtplib.SMTPServerDisconnected, ConnectionError, socket.timeout, TimeoutError, ssl.SSLError)


def parse_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme not in ("smtp", "smtps"):
        raise config.ConfigError(f"SMTP_URL must start with smtp:// or smtps://, got {url!r}")
    query = {k: v[-1].lower() for k, v in parse_qs(parsed.query).items()}
    implicit_tls = parsed.scheme == "smtps"
    return {
        "host": parsed.hostname or "localhost",
        "port": parsed.port or (465 if implicit_tls else 25),
        "ssl": implicit_tls,
        "starttls": not implicit_tls and query.get("starttls") in ("1", "true", "yes", "required"),
        "insecure": query.get("insecure") in ("1", "true", "yes"),
        "username": unquote(parsed.username) if parsed.username else None,
        "password": unquote(parsed.password) if parsed.password else None,
    }


class ThreadedPool:
    """The threaded pool's connections (SMTP_ASYNC=0). A lane holds a place while it sends: an idle
    connection, or room to open one; places held and idle connections together stay within
    `limit()` (`size`, fewer once the relay refused one more: smtp_sizing.RelayCeiling). A lane
    that finds neither waits; at most CONNECT_BURST connects run at once; connections idle for
    `idle_timeout` are closed."""

    def __init__(self, size: int, connect, idle_timeout: float):
        self.size, self._connect, self.idle_timeout = size, connect, idle_timeout
        self.ceiling = RelayCeiling()
        self._lock = threading.Condition()
        self._idle: collections.deque = collections.deque()  # (connection, idle since), most recent on the right
        self._conns: set = set()  # every connection opened, until seen closed
        self._held = 0  # places held by lanes
        self._connecting = 0
        self._reaper: threading.Timer | None = None
        self._closed = False

    def limit(self) -> int:
        ceiling = self.ceiling.current()
        return self.size if ceiling is None else max(1, min(self.size, ceiling))

    def acquire(self) -> smtplib.SMTP | None:
        """A place for a lane: an idle connection, or None with room to open one."""
        with self._lock:
            while True:
                conn = self._take_idle()
                if conn is not None or self._held + len(self._idle) < self.limit():
                    self._held += 1
                    return conn
                self._lock.wait(1.0)  # also re-counts what lanes closed

    def connect(self, deadline: float, fresh: bool = False) -> smtplib.SMTP:
        """A connection for a lane that holds a place but no connection: an idle one (not when
        `fresh`: the lane's last one just died, the idle ones may be as dead) or a new one. Raises
        TransientError (the relay is unreachable, the batch out of time) or PermanentError."""
        while True:
            stale = None
            with self._lock:
                while True:
                    conn = None if fresh else self._take_idle()
                    if conn is not None:
                        return conn
                    if self._open() + self._connecting < self.limit() and self._connecting < CONNECT_BURST:
                        self._connecting += 1
                        epoch = self.ceiling.epoch
                        break
                    if fresh and self._idle:
                        stale = self._idle.popleft()[0]  # room for a new one
                        self._conns.discard(stale)
                        break
                    self._wait(deadline)  # refused at the limit, or connects under way
            if stale is not None:
                _quit(stale)
                continue
            try:
                conn = self._connect()
            except RelayRefused as exc:
                with self._lock:
                    self._connecting -= 1
                    self._lock.notify_all()
                    while self._open() == 0 and self._connecting:  # the others' connects may yet get in
                        self._wait(deadline)
                    established = self._open()
                    if established == 0:
                        self.ceiling.forget()  # the relay is down or full with others: no limit of ours
                        raise
                    if self.ceiling.refused(established, epoch):
                        log.warning(
                            "SMTP relay refused connection %d (%s); this process keeps at most %d",
                            established + 1,
                            exc,
                            self.limit(),
                        )
                continue
            except BaseException:
                with self._lock:
                    self._connecting -= 1
                    self._lock.notify_all()
                raise
            with self._lock:
                self._connecting -= 1
                self._conns.add(conn)
                self.ceiling.accepted(self._open(), epoch)
                self._lock.notify_all()
            return conn

    def release(self, conn: smtplib.SMTP | None) -> None:
        """The lane is done: its place is free, its connection idle (or closed above the limit)."""
        surplus = None
        with self._lock:
            self._held -= 1
            if conn is not None and conn.sock is not None:
                if self._closed or self._open() > self.limit():
                    surplus = conn
                    self._conns.discard(conn)
                else:
                    self._idle.append((conn, time.monotonic()))
                    self._schedule_reap()
            self._lock.notify_all()
        _quit(surplus)

    def _take_idle(self) -> smtplib.SMTP | None:
        """The most recently used idle connection still open; the caller holds the lock."""
        while self._idle:
            conn = self._idle.pop()[0]
            if conn.sock is not None:
                return conn
        return None

    def _wait(self, deadline: float) -> None:
        """The caller holds the lock: until notified (at most a second), TransientError at `deadline`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransientError(BATCH_OUT_OF_TIME)
        self._lock.wait(min(remaining, 1.0))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._reaper is not None:
                self._reaper.cancel()
            idle = [conn for conn, _ in self._idle]
            self._idle.clear()
        for conn in idle:
            _quit(conn)

    def _open(self) -> int:
        """Connections open (idle or in use); the caller holds the lock."""
        self._conns = {conn for conn in self._conns if conn.sock is not None}
        return len(self._conns)

    def _schedule_reap(self) -> None:
        if self._reaper is None and self._idle and not self._closed:
            due = self._idle[0][1] + self.idle_timeout - time.monotonic()
            self._reaper = threading.Timer(max(0.0, due), self._reap)
            self._reaper.daemon = True
            self._reaper.start()

    def _reap(self) -> None:
        expired = []
        with self._lock:
            self._reaper = None
            cutoff = time.monotonic() - self.idle_timeout
            while self._idle and self._idle[0][1] <= cutoff:
                expired.append(self._idle.popleft()[0])
            self._schedule_reap()
        for conn in expired:
            _quit(conn)


class SMTPProvider(Provider):
    name = "smtp"
    max_batch = 1000
    # 1,000 rows per claim: fewer claims, marks and per-batch set-up, and at a slow relay more mails
    # in flight per send chain; faster than 100/250/500 at both relay delays in scripts/bench/knobs.py,
    # for a larger worker peak RSS.
    # The cost: a worker killed mid-batch leaves up to this many rows for the reclaimer, and the ones
    # the relay had accepted go again (same Message-ID, so receivers can drop the copy).
    preferred_batch = 1000

    def __init__(
        self,
        url: str | None = None,
        pool_size: int | None = None,
        timeout: float | None = None,
        use_async: bool | None = None,
    ):
        """`pool_size` given: exactly that many connections at most. Not given: SMTP_POOL_SIZE
        connections, growing towards SMTP_POOL_MAX while that raises throughput (async pool)."""
        settings = config.get()
        self.options = parse_url(url or settings.smtp_url)
        self.pool_size = max(1, pool_size or settings.smtp_pool_size)
        self.pool_max = self.pool_size if pool_size else max(self.pool_size, settings.smtp_pool_max)
        self.timeout = timeout or settings.smtp_timeout_seconds
        self.idle_timeout = settings.smtp_idle_timeout_seconds
        self._latency = 0.05  # seconds per mail on one connection; measured as batches go
        self.use_async = config.get().smtp_async if use_async is None else use_async
        self._async: AsyncSender | None = None
        self._threaded = ThreadedPool(self.pool_size, self._connect, self.idle_timeout)
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------
    def _tls_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        if self.options["insecure"]:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _connect(self) -> smtplib.SMTP:
        o = self.options
        conn: smtplib.SMTP | None = None
        greeted = False  # refusals come before or in answer to the greeting and EHLO
        failed = f"cannot connect to SMTP {o['host']}:{o['port']}"
        try:
            if o["ssl"]:
                conn = smtplib.SMTP_SSL(o["host"], o["port"], timeout=self.timeout, context=self._tls_context())
            else:
                conn = smtplib.SMTP(o["host"], o["port"], timeout=self.timeout)
            code, text = conn.ehlo()
            if refuses_connections(code, text.decode("utf-8", "replace")):
                raise RelayRefused(f"{failed}: {code} {text!r}")
            greeted = True
            if o["starttls"]:
                conn.starttls(context=self._tls_context())
                conn.ehlo()
            if o["username"]:
                conn.login(o["username"], o["password"] or "")
            return conn
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, RelayRefused):
                raise
            if isinstance(exc, smtplib.SMTPAuthenticationError):
                raise PermanentError(f"SMTP login refused by {o['host']}: {exc.smtp_code} {exc.smtp_error!r}") from exc
            if isinstance(exc, smtplib.SMTPNotSupportedError):  # e.g. AUTH only offered after STARTTLS
                raise PermanentError(f"SMTP server {o['host']}: {exc} (check SMTP_URL, e.g. ?starttls=1)") from exc
            if isinstance(exc, smtplib.SMTPConnectError):  # the greeting was not a 220
                reply = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc)
                error = RelayRefused if refuses_connections(exc.smtp_code, reply) else TransientError
                raise error(f"{failed}: {exc}") from exc
            if not greeted and isinstance(exc, (ConnectionError, smtplib.SMTPServerDisconnected)):
                raise RelayRefused(f"{failed}: {exc!r}") from exc  # refused, reset or closed at the greeting
            if isinstance(exc, (smtplib.SMTPException, OSError)):
                raise TransientError(f"{failed}: {exc}") from exc
            raise

    def _acquire(self) -> smtplib.SMTP | None:
        """A place among the threaded pool's connections, with an idle connection if one exists
        (None: the lane opens one)."""
        return self._threaded.acquire()

    def _release(self, conn: smtplib.SMTP | None) -> None:
        self._threaded.release(conn)

    # -- sending -----------------------------------------------------------------------------
    def _send_one(self, conn, m: OutgoingMail, raw: bytes) -> SendResult:
        sender = mail.envelope_from(m.from_addr)
        if not (sender.isascii() and m.to.isascii()):
            if not conn.has_extn("smtputf8"):
                return SendResult(
                    ok=False, permanent=True, error="non-ASCII address and the server does not offer SMTPUTF8"
                )
            conn.sendmail(sender, [m.to], raw, mail_options=["SMTPUTF8"])
        elif conn.does_esmtp and conn.has_extn("pipelining"):
            _pipelined_sendmail(conn, sender, m.to, raw)
        else:
            conn.sendmail(sender, [m.to], raw)
        return SendResult(ok=True, message_id=mail.message_id_of(m))

    def _send_chunk(
        self, items: list[tuple[int, OutgoingMail, bytes]], deadline: float, progress: Progress
    ) -> list[tuple[int, SendResult]]:
        out = Reported(progress)
        conn = self._acquire()
        started = time.perf_counter()
        try:
            for pos, (index, m, raw) in enumerate(items):
                progress.poll()  # inline on the caller's thread: record and check between mails
                rest = not_started(items[pos:], deadline, progress)
                if rest is not None:
                    out.extend(rest)
                    break
                for attempt in (1, 2):
                    try:
                        if conn is None:
                            conn = self._threaded.connect(deadline, fresh=attempt > 1)
                        out.append((index, self._send_one(conn, m, raw)))
                        break
                    except smtplib.SMTPRecipientsRefused as exc:
                        code, text = next(iter(exc.recipients.values()), (450, b""))
                        out.append((index, _reply_result(code, text)))
                        break
                    except smtplib.SMTPResponseException as exc:  # sender refused, data error, …
                        out.append((index, _reply_result(exc.smtp_code, exc.smtp_error)))
                        if exc.smtp_code == 421:  # server is closing the connection
                            _quit(conn)
                            conn = None
                        break
                    except _DISCONNECTS + (OSError, smtplib.SMTPException) as exc:
                        # A pooled connection the server closed while idle: reopen once. If the
                        # mail may already have been accepted, the retry carries the same
                        # Message-ID, which is the idempotency contract.
                        _quit(conn)
                        conn = None
                        if attempt == 2:
                            out.append((index, SendResult(ok=False, error=f"SMTP connection lost: {exc}")))
                    except TransientError as exc:  # cannot (re)connect: the rest of the chunk fails too
                        for index2, _, _ in items[pos:]:
                            out.append((index2, SendResult(ok=False, error=str(exc))))
                        return out
                    except (PermanentError, KeyboardInterrupt, SystemExit):
                        raise
                    except Exception as exc:  # a bug or an odd reply: this mail retries later, the lane goes on
                        log.exception("unexpected error sending %s", m.idempotency_key)
                        _quit(conn)
                        conn = None
                        out.append((index, SendResult(ok=False, error=f"unexpected SMTP client error: {exc!r}")))
                        break
        finally:
            self._release(conn)
            if items:
                per_mail = (time.perf_counter() - started) / len(items)
                self._latency += 0.2 * (per_mail - self._latency)  # EWMA; races only blur it
        return out

    def lanes_for(self, count: int) -> int:
        """Connections to use for `count` mails: enough that the batch takes about
        LANE_TARGET_SECONDS. A fast relay gets one lane (no thread hand-offs, which cost more CPU
        than a loopback send); a 50 ms ESP round trip gets many, up to the pool size."""
        wanted = -(-count * self._latency // LANE_TARGET_SECONDS)
        return int(min(self._threaded.limit(), count, max(1, wanted)))

    def _async_sender(self):
        if self._async is None:
            with self._executor_lock:
                if self._async is None:
                    self._async = AsyncSender(
                        self.options, self.pool_size, self.pool_max, self.timeout, self._tls_context, self.idle_timeout
                    )
        return self._async

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="smtp")
        return self._executor

    def prepare(self, m: OutgoingMail) -> tuple[OutgoingMail, bytes, str]:
        """(the mail with its envelope address, its wire bytes, its Message-ID)."""
        to = mail.check_address(m.to)  # the envelope's form (IDNA domain)
        if to != m.to:
            m = dataclasses.replace(m, to=to)
        raw, message_id = mail.build_with_id(m)
        return m, raw, message_id

    def deliver(
        self, prepared: list[tuple[OutgoingMail, tuple[OutgoingMail, bytes, str]]], progress: Progress
    ) -> list[SendResult]:
        ready = [(i, m, raw) for i, (_, (m, raw, _)) in enumerate(prepared)]
        ids = [message_id for _, (_, _, message_id) in prepared]
        results: list[SendResult | None] = [None] * len(ready)
        # Bounds a batch's send phase (plus one mail's SMTP timeout in flight), so a batch never
        # outlives DIGEST_PROCESSING_TIMEOUT_SECONDS / RECLAIM_AFTER_SECONDS, however slow the relay.
        deadline = time.monotonic() + BATCH_TIMEOUTS * self.timeout
        if self.use_async:
            # All connections on one event loop: lanes are cheap; how many, the measured throughput decides.
            done = [self._async_sender().send(ready, deadline, progress, ids)]
        else:
            # Each lane is one connection sending its share of the batch in sequence.
            lanes = self.lanes_for(len(ready))
            chunks = [ready[k::lanes] for k in range(lanes)]
            if lanes == 1:
                done = [self._send_chunk(chunks[0], deadline, progress)]
            else:
                futures = [self._pool().submit(self._send_chunk, chunk, deadline, progress) for chunk in chunks]
                for future in futures:
                    future.add_done_callback(lambda _: progress.wake())
                while not all(f.done() for f in futures):
                    progress.wait(time.monotonic() + 1.0)
                    progress.poll()
                done = [f.result() for f in futures]
        for chunk in done:
            for index, result in chunk:
                results[index] = result
        if all(r is not None and not r.ok and not r.permanent and "cannot connect" in (r.error or "") for r in results):
            # Nothing got through because the server is unreachable: one error for the whole call.
            raise TransientError(cast(SendResult, results[0]).error)
        return cast(list[SendResult], results)  # every index has its result now

    def close(self) -> None:
        self._threaded.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._async is not None:
            self._async.close()


def _pipelined_sendmail(conn: smtplib.SMTP, sender: str, rcpt: str, raw: bytes) -> None:
    """RFC 2920 PIPELINING: MAIL, RCPT and DATA in one write, then the message: two round trips per
    mail instead of four (smtplib.sendmail waits for each reply). Raises the same exceptions."""
    size = f" SIZE={len(raw)}" if conn.has_extn("size") else ""
    conn.send(f"MAIL FROM:<{sender}>{size}\r\nRCPT TO:<{rcpt}>\r\nDATA\r\n".encode("ascii"))
    mail_code, mail_msg = conn.getreply()
    rcpt_code, rcpt_msg = conn.getreply()
    data_code, data_msg = conn.getreply()
    ok_envelope = mail_code == 250 and rcpt_code in (250, 251)
    if data_code == 354 and ok_envelope:
        body = _LEADING_DOT.sub(b"..", raw)
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        conn.send(body + b".\r\n")
        code, msg = conn.getreply()
        if code != 250:
            raise smtplib.SMTPDataError(code, msg)
        return
    if data_code == 354:
        # The server took DATA although the envelope failed: closing is the only way to abort
        # without delivering an empty message. The next mail reconnects.
        conn.close()
    else:
        try:
            conn.rset()
        except smtplib.SMTPServerDisconnected:
            pass
    if mail_code != 250:
        raise smtplib.SMTPSenderRefused(mail_code, mail_msg, sender)
    if not ok_envelope:
        raise smtplib.SMTPRecipientsRefused({rcpt: (rcpt_code, rcpt_msg)})
    raise smtplib.SMTPDataError(data_code, data_msg)


def _reply_result(code: int, text) -> SendResult:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return SendResult(ok=False, error=f"SMTP {code} {text}".strip(), permanent=500 <= int(code) < 600)


def _quit(conn) -> None:
    if conn is None:
        return
    try:
        conn.quit()
    except Exception:  # already gone; nothing to release but the socket
        try:
            conn.close()
        except Exception:
            pass
