"""Many SMTP connections driven by one asyncio event loop thread (used by SMTPProvider).

Why: with a 50 ms round trip per message, 1000 mails/s needs ~50 messages in flight. With one
thread per connection every reply wakes a thread that must win the GIL back: measured ~120 us of
CPU per mail on top of the send itself. One event loop multiplexing all connections pays for
readiness events only. The SMTP dialogue is the same as smtplib's (EHLO, STARTTLS, AUTH PLAIN/LOGIN,
PIPELINING when offered, dot-stuffing), and reply codes map to results the same way.

Kept over the libraries a user would reach for: `scripts/bench/smtp_client.py` (6,000 mails, 50
connections, client CPU per mail with mail building) measured ours 112 µs, smtplib 243 µs and
aiosmtplib 5.1.3 257 µs on a quiet machine; on a busy one today 253–302 µs against smtplib's
464–503 µs (aiosmtplib not installed then).
"""
from __future__ import annotations

import asyncio
import base64
import logging
import math
import re
import ssl
import threading
import time

from app import mail
from app.providers.base import STOPPED, PermanentError, Progress, SendResult, TransientError

log = logging.getLogger("app.providers.smtp_async")

_LEADING_DOT = re.compile(rb"(?m)^\.")
MAX_REPLY_LINES = 100
LANE_TARGET_SECONDS = 0.025   # lanes enough that a batch's share per connection takes about this
BATCH_OUT_OF_TIME = "not attempted: the batch ran out of time (slow SMTP relay); retried later"


def out_of_time(items) -> list:
    """A slow relay used up the batch's time: the mails not started retry later, counted."""
    return [(index, SendResult(ok=False, error=BATCH_OUT_OF_TIME)) for index, _, _ in items]


def not_started(items, deadline: float, progress: Progress) -> list | None:
    """The rest of a lane when it must not start its next mail: out of time, or asked to stop."""
    if progress.stop_requested():
        return [(index, STOPPED) for index, _, _ in items]
    if time.monotonic() > deadline:
        return out_of_time(items)
    return None


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop   # installed with uvicorn[standard]; about a third less CPU per mail here
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class ReplyError(Exception):
    def __init__(self, code: int, text: str):
        super().__init__(f"SMTP {code} {text}")
        self.code, self.text = code, text


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.extensions: set[str] = set()
        self.auth_mechanisms: set[str] = set()
        self.broken = False

    async def reply(self) -> tuple[int, str]:
        lines = []
        for _ in range(MAX_REPLY_LINES):
            line = await self.reader.readline()
            if not line:
                raise ConnectionError("SMTP server closed the connection")
            lines.append(line[4:].strip().decode("utf-8", "replace"))
            if line[3:4] != b"-":
                try:
                    return int(line[:3]), "\n".join(lines)
                except ValueError:
                    raise ConnectionError(f"malformed SMTP reply {line[:40]!r}") from None
        raise ConnectionError("SMTP reply too long")

    async def command(self, line: str) -> tuple[int, str]:
        self.writer.write(line.encode("utf-8") + b"\r\n")
        return await self.reply()

    async def ehlo(self, name: str) -> None:
        code, text = await self.command(f"EHLO {name}")
        if code != 250:
            raise ReplyError(code, text)
        self.extensions, self.auth_mechanisms = set(), set()
        for entry in text.split("\n")[1:]:
            word, _, rest = entry.partition(" ")
            self.extensions.add(word.lower())
            if word.upper() == "AUTH":
                self.auth_mechanisms = {m.upper() for m in rest.split()}

    def close(self) -> None:
        self.broken = True
        try:
            self.writer.close()
        except Exception:
            pass


class AsyncSender:
    """Owns an event loop thread and up to pool_max open connections (for every thread of the
    process). A batch gets pool_size lanes (connections) at least, and more when the relay is
    slow: by Little's law, lanes = mails x observed seconds per mail / LANE_TARGET_SECONDS, so a
    batch takes about that long whatever the relay's round trip, up to pool_max."""

    def __init__(self, options: dict, pool_size: int, pool_max: int, timeout: float, tls_context_factory):
        self.options, self.pool_size, self.pool_max, self.timeout = options, pool_size, max(pool_size, pool_max), timeout
        self.latency = 0.0      # seconds per mail transaction (EWMA of the relay's round trips)
        self._tls = tls_context_factory
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="smtp-async", daemon=True)
        self._thread.start()
        self._idle: list[Connection] = []
        self._slots: asyncio.Semaphore | None = None

    # -- connection set-up -----------------------------------------------------------------
    async def _connect(self) -> Connection:
        o = self.options
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                o["host"], o["port"], ssl=self._tls() if o["ssl"] else None,
                server_hostname=o["host"] if o["ssl"] else None), self.timeout)
            conn = Connection(reader, writer)
            code, text = await asyncio.wait_for(conn.reply(), self.timeout)
            if code != 220:
                raise ReplyError(code, text)
            await asyncio.wait_for(conn.ehlo("localhost"), self.timeout)
            if o["starttls"]:
                if "starttls" not in conn.extensions:
                    raise PermanentError(f"SMTP server {o['host']} does not offer STARTTLS")
                code, text = await asyncio.wait_for(conn.command("STARTTLS"), self.timeout)
                if code != 220:
                    raise ReplyError(code, text)
                await asyncio.wait_for(writer.start_tls(self._tls(), server_hostname=o["host"]), self.timeout)
                await asyncio.wait_for(conn.ehlo("localhost"), self.timeout)
            if o["username"]:
                await asyncio.wait_for(self._login(conn), self.timeout)
            return conn
        except PermanentError:
            raise
        except ReplyError as exc:
            if exc.code in (530, 534, 535, 538):
                raise PermanentError(f"SMTP login refused by {o['host']}: {exc}") from exc
            raise TransientError(f"cannot connect to SMTP {o['host']}:{o['port']}: {exc}") from exc
        except (OSError, asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            raise TransientError(f"cannot connect to SMTP {o['host']}:{o['port']}: {exc!r}") from exc

    async def _login(self, conn: Connection) -> None:
        user, password = self.options["username"], self.options["password"] or ""
        if "PLAIN" in conn.auth_mechanisms:
            token = base64.b64encode(f"\0{user}\0{password}".encode()).decode()
            code, text = await conn.command(f"AUTH PLAIN {token}")
        elif "LOGIN" in conn.auth_mechanisms:
            code, text = await conn.command("AUTH LOGIN")
            if code == 334:
                code, text = await conn.command(base64.b64encode(user.encode()).decode())
            if code == 334:
                code, text = await conn.command(base64.b64encode(password.encode()).decode())
        else:
            raise PermanentError(f"SMTP server {self.options['host']} offers no AUTH PLAIN/LOGIN here "
                                 "(check SMTP_URL, e.g. ?starttls=1)")
        if code != 235:
            raise ReplyError(code, text)

    # -- one message -------------------------------------------------------------------------
    async def _transaction(self, conn: Connection, sender: str, rcpt: str, raw: bytes) -> None:
        size = f" SIZE={len(raw)}" if "size" in conn.extensions else ""
        if not (sender.isascii() and rcpt.isascii()):
            if "smtputf8" not in conn.extensions:
                raise ReplyError(553, "non-ASCII address and the server does not offer SMTPUTF8")
            size += " SMTPUTF8"
        lines = [f"MAIL FROM:<{sender}>{size}", f"RCPT TO:<{rcpt}>", "DATA"]
        if "pipelining" in conn.extensions:
            conn.writer.write("".join(f"{line}\r\n" for line in lines).encode("utf-8"))
            replies = [await conn.reply() for _ in lines]
        else:
            replies = []
            for line in lines:
                replies.append(await conn.command(line))
                if replies[-1][0] >= 400:
                    break
        codes = [code for code, _ in replies]
        envelope_ok = codes[0] == 250 and len(codes) > 1 and codes[1] in (250, 251)
        if len(codes) == 3 and codes[2] == 354 and envelope_ok:
            body = _LEADING_DOT.sub(b"..", raw) if raw[:1] == b"." or b"\n." in raw else raw
            if not body.endswith(b"\r\n"):
                body += b"\r\n"
            conn.writer.write(body + b".\r\n")
            await conn.writer.drain()
            code, text = await conn.reply()
            if code != 250:
                raise ReplyError(code, text)
            return
        if len(codes) == 3 and codes[2] == 354:
            conn.close()      # DATA accepted after a failed envelope: only closing aborts it
        else:
            code, _ = await conn.command("RSET")
        failed = next((r for r in replies if r[0] not in (250, 251, 354)), replies[-1])
        raise ReplyError(*failed)

    def lanes_for(self, count: int) -> int:
        wanted = math.ceil(count * self.latency / LANE_TARGET_SECONDS)
        return max(1, min(count, self.pool_max, max(self.pool_size, wanted)))

    async def _send_lane(self, items, deadline: float, progress: Progress) -> list:
        out = Reported(progress)
        await self._slots.acquire()
        conn = self._idle.pop() if self._idle else None
        try:
            for pos, (index, m, raw) in enumerate(items):
                rest = not_started(items[pos:], deadline, progress)
                if rest is not None:
                    out.extend(rest)
                    break
                sender = mail.envelope_from(m.from_addr)
                for attempt in (1, 2):
                    try:
                        if conn is None or conn.broken:
                            conn = await self._connect()
                        began = time.perf_counter()
                        # asyncio.timeout, not wait_for: wait_for wraps each mail in a new task
                        async with asyncio.timeout(self.timeout):
                            await self._transaction(conn, sender, m.to, raw)
                        took = time.perf_counter() - began
                        # EWMA (one thread: the loop's); the first round trip is taken as it is
                        self.latency = took if not self.latency else self.latency + 0.05 * (took - self.latency)
                        out.append((index, SendResult(ok=True, message_id=mail.message_id_of(m))))
                        break
                    except ReplyError as exc:
                        out.append((index, SendResult(ok=False, error=str(exc), permanent=500 <= exc.code < 600)))
                        if exc.code == 421 and conn is not None:
                            conn.close()
                        break
                    except (TransientError, PermanentError) as exc:   # (re)connect failed
                        if isinstance(exc, PermanentError):
                            raise
                        for index2, _, _ in items[pos:]:
                            out.append((index2, SendResult(ok=False, error=str(exc))))
                        return out
                    except (OSError, asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError,
                            ssl.SSLError) as exc:
                        # dropped idle connection: reopen once (a re-send carries the same Message-ID)
                        if conn is not None:
                            conn.close()
                        conn = None
                        if attempt == 2:
                            out.append((index, SendResult(ok=False, error=f"SMTP connection lost: {exc!r}")))
                    except Exception as exc:   # a bug or an odd reply: this mail retries later, the lane goes on
                        log.exception("unexpected error sending %s", m.idempotency_key)
                        if conn is not None:
                            conn.close()
                        conn = None
                        out.append((index, SendResult(ok=False, error=f"unexpected SMTP client error: {exc!r}")))
                        break
        finally:
            if conn is not None and not conn.broken:
                self._idle.append(conn)
            self._slots.release()
        return out

    async def _send_all(self, ready, deadline: float, progress: Progress) -> list:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.pool_max)
        first = []
        if not self.latency and len(ready) > self.pool_size:
            # The relay's round trip is unknown until a mail has gone: one goes alone first, so the
            # rest of the first batch already gets the lanes Little's law asks for, instead of
            # pool_size lanes taking 100 round trips in turns of 8 (a 50 ms relay: ~0.6 s).
            first, ready = await self._send_lane(ready[:1], deadline, progress), ready[1:]
        lanes = self.lanes_for(len(ready))
        chunks = [ready[k::lanes] for k in range(lanes)]
        done = await asyncio.gather(*(self._send_lane(c, deadline, progress) for c in chunks))
        return first + [pair for chunk in done for pair in chunk]

    def send(self, ready, deadline: float, progress: Progress) -> list:
        """[(index, SendResult)] for [(index, mail, raw bytes)], from any thread. No mail is started
        after `deadline` (time.monotonic()) or once `progress` asks to stop: those come back as
        transient failures or STOPPED. The calling thread polls `progress` while it waits."""
        if not self._thread.is_alive():
            raise TransientError("SMTP event loop thread is not running")
        future = asyncio.run_coroutine_threadsafe(self._send_all(ready, deadline, progress), self._loop)
        future.add_done_callback(lambda _: progress.wake())
        # Every step inside has its own timeout and no mail starts after `deadline`; this outer bound
        # only guards against a wedged loop (a lane may first wait for one that other batches hold).
        limit = max(deadline, time.monotonic()) + 3 * self.timeout + 10
        while not future.done() and time.monotonic() < limit:
            progress.wait(limit)
            progress.poll()
        try:
            return future.result(timeout=0)
        except TimeoutError:
            future.cancel()
            raise TransientError("SMTP sending timed out as a whole") from None

    def close(self) -> None:
        async def shutdown():
            for conn in self._idle:
                try:
                    conn.writer.write(b"QUIT\r\n")
                    await asyncio.wait_for(conn.writer.drain(), 1)
                except Exception:
                    pass
                conn.close()
            self._idle.clear()

        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)


class Reported(list):
    """A lane's [(index, SendResult)] that also reports each result to the batch's Progress."""

    def __init__(self, progress: Progress):
        super().__init__()
        self._progress = progress

    def append(self, pair) -> None:
        super().append(pair)
        self._progress.add(*pair)

    def extend(self, pairs) -> None:
        for pair in pairs:
            self.append(pair)
