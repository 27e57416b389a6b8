"""Many SMTP connections driven by one asyncio event loop thread (used by SMTPProvider).

Why: with a 50 ms round trip per message, 1000 mails/s needs ~50 messages in flight. With one
thread per connection every reply wakes a thread that must win the GIL back, a CPU cost per mail on
top of the send itself. One event loop multiplexing all connections pays for readiness events only.
The SMTP dialogue is the same as smtplib's (EHLO, STARTTLS, AUTH PLAIN/LOGIN,
PIPELINING when offered, dot-stuffing), and reply codes map to results the same way. With
PIPELINING a lane also sends its next mail's envelope in the write that ends this mail's data
(RFC 2920 3.1): one write and one wait per mail instead of two, the loopback send's system call
being most of what a mail costs this thread. How many
connections the process holds, AsyncPool keeps as app/platform/providers/smtp_sizing.py decides.

Kept over the libraries a user would reach for: `scripts/bench/smtp_client.py` measures the client
CPU per mail against smtplib with a thread per connection (and aiosmtplib where installed); ours
costs well under half (BENCHMARKS.md, "SMTP client").
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import re
import ssl
import threading
import time

from app.platform import mail
from app.platform.providers.base import STOPPED, PermanentError, Progress, SendResult, TransientError
from app.platform.providers.smtp_sizing import CONNECT_BURST, SMALL_LIMITS, LaneSizer, RelayRefused, refuses_connections

log = logging.getLogger("app.platform.providers.smtp_async")

_LEADING_DOT = re.compile(rb"(?m)^\.")
MAX_REPLY_LINES = 100
HEARTBEAT_SECONDS = 0.005  # while lanes send, the loop's lateness is sampled this often (smtp_sizing.py)
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
        import uvloop  # installed with uvicorn[standard]; about a third less CPU per mail here

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
        self.idle_since = 0.0
        # The envelope and DATA of the lane's next mail went out with the last mail's data: their
        # replies come first (AsyncSender._transaction).
        self.envelope_sent = False
        self.on_close = None  # the pool's bookkeeping, called once when the connection closes

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

    def alive(self) -> bool:
        """False once the server closed it (a relay drops idle clients) or it broke."""
        return not (self.broken or self.writer.is_closing() or self.reader.at_eof() or self.reader.exception())

    def quit(self) -> None:
        """Close politely without waiting for the answer (the pool is done with it)."""
        if not self.broken:
            try:
                self.writer.write(b"QUIT\r\n")
            except Exception:
                pass
        self.close()

    def close(self) -> None:
        if not self.broken and self.on_close is not None:
            self.on_close(self)
        self.broken = True
        try:
            self.writer.close()
        except Exception:
            pass


class AsyncPool:
    """The connections of one AsyncSender. A lane holds a place while it sends: an idle connection,
    or room to open one; places held and idle connections together stay within `sizer.limit()`, so
    open connections do. A lane that finds neither waits (FIFO). At most `_burst()` connects run at
    once; connections idle for `idle_timeout` are closed. Every method runs on the loop thread."""

    def __init__(self, sizer: LaneSizer, connect, idle_timeout: float):
        self.sizer, self._connect, self.idle_timeout = sizer, connect, idle_timeout
        self.open = 0  # established connections, idle or in use
        self.peak = 0  # most open at once (for tests and logs)
        self._held = 0  # places held by lanes
        self._connecting = 0
        self._idle: collections.deque[Connection] = collections.deque()  # most recently used on the right
        self._waiters: collections.deque[asyncio.Future] = collections.deque()  # lanes waiting for a place
        # lanes that hold a place and wait for a connection (refused at the limit, connects under way)
        self._holders: collections.deque[asyncio.Future] = collections.deque()
        self._reaper: asyncio.TimerHandle | None = None
        self._heartbeat: asyncio.TimerHandle | None = None

    async def acquire(self) -> Connection | None:
        """A place for a lane: an idle connection, or None with room to open one."""
        self.sizer.resumed()
        if self._heartbeat is None:
            self._beat()
        while True:
            conn = self._take_idle()
            if conn is not None or self._held + len(self._idle) < self.sizer.limit():
                self._held += 1
                return conn
            self.sizer.waited()
            await self._wait(self._waiters)

    async def connect(self, deadline: float, fresh: bool = False) -> Connection:
        """A connection for a lane that holds a place but no connection: an idle one (not when
        `fresh`: the lane's last one just died, the idle ones may be as dead) or a new one. Raises
        TransientError (the relay is unreachable, the batch out of time) or PermanentError."""
        while True:
            if not fresh:
                conn = self._take_idle()
                if conn is not None:
                    return conn
            if self.open + self._connecting < self.sizer.limit() and self._connecting < self._burst():
                conn = await self._open(deadline)
                if conn is not None:
                    return conn
            elif fresh and self._idle:
                self._idle.popleft().quit()  # room for a new one
            else:  # refused at the limit, or connects under way: wait for a connection
                await self._wait(self._holders, deadline)

    def release(self, conn: Connection | None) -> None:
        """The lane is done: its place is free, its connection idle (or closed above the limit)."""
        self._held -= 1
        if conn is not None and not conn.broken:
            if self.open > self.sizer.limit():
                conn.quit()
            else:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
                self._schedule_reap()
        self._wake()
        if not self._held and not self._connecting:
            self.sizer.paused()
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                self._heartbeat = None

    def delivered(self, seconds: float) -> None:
        if self._heartbeat is not None:
            # A late turn runs the replies it waited for before its timers: the heartbeat due during
            # the stall has not reported yet, so how overdue it is now counts too.
            self._report_lateness()
        settled = not self.sizer.settling or self._settled()
        if self.sizer.delivered(seconds, self.open - len(self._idle), bool(self._waiters), settled):
            self._trim()
            self._wake()

    def close(self) -> None:
        for timer in (self._reaper, self._heartbeat):
            if timer is not None:
                timer.cancel()
        self._reaper = self._heartbeat = None
        while self._idle:
            self._idle.pop().quit()

    # -- inside ------------------------------------------------------------------------------
    def _beat(self) -> None:
        """While lanes send: how late the loop runs a timer, for the sizer to tell this process's
        lateness from the relay's round trip."""
        if self._heartbeat is not None:
            self._report_lateness()
        self._heartbeat = asyncio.get_running_loop().call_later(HEARTBEAT_SECONDS, self._beat)

    def _report_lateness(self) -> None:
        """How far past its time the heartbeat is (or was, when it runs), in the loop's own clock."""
        assert self._heartbeat is not None
        self.sizer.loop_late(max(0.0, asyncio.get_running_loop().time() - self._heartbeat.when()))

    def _settled(self) -> bool:
        """No connection being opened, and as many open as the limit allows (or the work needs)."""
        limit = self.sizer.limit()
        return not self._connecting and (self.open == limit or (self.open < limit and not self._waiters))

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.alive():
                return conn
            conn.close()
        return None

    async def _open(self, deadline: float) -> Connection | None:
        """A new connection, or None when the relay refused it because of how many we hold."""
        epoch = self.sizer.ceiling.epoch
        self._connecting += 1
        try:
            conn = await self._connect()
            conn.on_close = self._closed
            self.open += 1
            self.peak = max(self.peak, self.open)
            self.sizer.ceiling.accepted(self.open, epoch)
            return conn
        except RelayRefused as exc:
            refused = exc
        finally:
            self._connecting -= 1
            self._wake()
            if self.sizer.settling and self._settled():
                self.sizer.settled()
        while self.open == 0 and self._connecting:  # the others' connects may yet get in
            await self._wait(self._holders, deadline)
        if self.open == 0:
            # Nothing of ours is open: the relay is down, restarting or full with others, which
            # says nothing about how many it takes from us.
            self.sizer.ceiling.forget()
            raise refused
        if self.sizer.refused(self.open, epoch):
            log.warning(
                "SMTP relay refused connection %d (%s); this process keeps at most %d",
                self.open + 1,
                refused,
                self.sizer.limit(),
            )
            self._trim()
        return None

    def _closed(self, conn: Connection) -> None:
        self.open -= 1
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self._wake()
        if self.sizer.settling and self._settled():
            self.sizer.settled()

    @staticmethod
    async def _wait(queue: collections.deque, deadline: float | None = None) -> None:
        """Until woken from `queue`; TransientError (out of time) at `deadline`."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TransientError(BATCH_OUT_OF_TIME)
        waiter = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            async with asyncio.timeout(remaining):
                await waiter
        except TimeoutError:
            raise TransientError(BATCH_OUT_OF_TIME) from None
        finally:
            if not waiter.done():
                waiter.cancel()
            try:
                queue.remove(waiter)
            except ValueError:
                pass

    def _wake(self) -> None:
        """Wake lanes for the idle connections and the room there is: first those that hold a place
        (their mails are in hand), then those waiting for one."""
        limit = self.sizer.limit()
        room = min(limit - self.open - self._connecting, self._burst() - self._connecting)
        left = self._wake_some(self._holders, len(self._idle) + max(0, room))
        self._wake_some(self._waiters, min(left, len(self._idle)) + max(0, limit - self._held - len(self._idle)))

    @staticmethod
    def _wake_some(queue: collections.deque, count: int) -> int:
        while count > 0 and queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1
        return count

    def _burst(self) -> int:
        """Connects at once: CONNECT_BURST, half of those open, all of those open past
        SMALL_LIMITS (relays that cap connections per client mostly cap below it)."""
        return max(CONNECT_BURST, self.open if self.open >= SMALL_LIMITS else self.open // 2)

    def _trim(self) -> None:
        """The limit went down: close idle connections above it (busy ones close when handed back)."""
        while self.open > self.sizer.limit() and self._idle:
            self._idle.popleft().quit()

    def _schedule_reap(self) -> None:
        if self._reaper is None and self._idle:
            due = self._idle[0].idle_since + self.idle_timeout - time.monotonic()
            self._reaper = asyncio.get_running_loop().call_later(max(0.0, due), self._reap)

    def _reap(self) -> None:
        self._reaper = None
        expired = time.monotonic() - self.idle_timeout
        while self._idle and self._idle[0].idle_since <= expired:
            self._idle.popleft().quit()
        self._schedule_reap()


class AsyncSender:
    """Owns an event loop thread and the process's pool of connections (for every thread of the
    process). The pool holds SMTP_POOL_SIZE connections and grows towards pool_max only while more
    connections raise the measured throughput (smtp_sizing.LaneSizer); a batch is split into as
    many lanes as the pool may use."""

    def __init__(
        self,
        options: dict,
        pool_size: int,
        pool_max: int,
        timeout: float,
        tls_context_factory,
        idle_timeout: float = 30.0,
    ):
        self.options, self.pool_size, self.pool_max, self.timeout = (
            options,
            pool_size,
            max(pool_size, pool_max),
            timeout,
        )
        self._tls = tls_context_factory
        self.sizer = LaneSizer(pool_size, self.pool_max)
        self._pool = AsyncPool(self.sizer, self._connect, idle_timeout)
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="smtp-async", daemon=True)
        self._thread.start()

    @property
    def latency(self) -> float:
        """Seconds per mail transaction (EWMA of the relay's round trips)."""
        return self.sizer.latency

    # -- connection set-up -----------------------------------------------------------------
    async def _connect(self) -> Connection:
        o = self.options
        conn = None
        greeted = False  # refusals come before or in answer to the greeting and EHLO
        # asyncio.timeout per step, not wait_for: wait_for runs each step as a task of its own, one
        # more turn of the event loop per step, which a busy process pays dearly in connect time.
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    o["host"],
                    o["port"],
                    ssl=self._tls() if o["ssl"] else None,
                    server_hostname=o["host"] if o["ssl"] else None,
                )
            conn = Connection(reader, writer)
            async with asyncio.timeout(self.timeout):
                code, text = await conn.reply()
            if code != 220:
                raise ReplyError(code, text)
            async with asyncio.timeout(self.timeout):
                await conn.ehlo("localhost")
            greeted = True
            if o["starttls"]:
                if "starttls" not in conn.extensions:
                    raise PermanentError(f"SMTP server {o['host']} does not offer STARTTLS")
                async with asyncio.timeout(self.timeout):
                    code, text = await conn.command("STARTTLS")
                if code != 220:
                    raise ReplyError(code, text)
                async with asyncio.timeout(self.timeout):
                    await writer.start_tls(self._tls(), server_hostname=o["host"])
                async with asyncio.timeout(self.timeout):
                    await conn.ehlo("localhost")
            if o["username"]:
                async with asyncio.timeout(self.timeout):
                    await self._login(conn)
            return conn
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, PermanentError):
                raise
            if isinstance(exc, ReplyError):
                if exc.code in (530, 534, 535, 538):
                    raise PermanentError(f"SMTP login refused by {o['host']}: {exc}") from exc
                error = RelayRefused if not greeted and refuses_connections(exc.code, exc.text) else TransientError
                raise error(f"cannot connect to SMTP {o['host']}:{o['port']}: {exc}") from exc
            if not greeted and isinstance(exc, (ConnectionError, asyncio.IncompleteReadError)):
                # refused or reset at connect, or closed before answering EHLO
                raise RelayRefused(f"cannot connect to SMTP {o['host']}:{o['port']}: {exc!r}") from exc
            if isinstance(exc, (OSError, asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError)):
                raise TransientError(f"cannot connect to SMTP {o['host']}:{o['port']}: {exc!r}") from exc
            raise

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
            raise PermanentError(
                f"SMTP server {self.options['host']} offers no AUTH PLAIN/LOGIN here (check SMTP_URL, e.g. ?starttls=1)"
            )
        if code != 235:
            raise ReplyError(code, text)

    # -- one message -------------------------------------------------------------------------
    @staticmethod
    def _envelope(conn: Connection, sender: str, rcpt: str, raw: bytes) -> list[str]:
        """The envelope's commands and DATA; ReplyError when the relay cannot take these addresses."""
        size = f" SIZE={len(raw)}" if "size" in conn.extensions else ""
        if not (sender.isascii() and rcpt.isascii()):
            if "smtputf8" not in conn.extensions:
                raise ReplyError(553, "non-ASCII address and the server does not offer SMTPUTF8")
            size += " SMTPUTF8"
        return [f"MAIL FROM:<{sender}>{size}", f"RCPT TO:<{rcpt}>", "DATA"]

    async def _transaction(self, conn: Connection, sender: str, rcpt: str, raw: bytes, then=None) -> None:
        """One mail. When `conn.envelope_sent`, its envelope and DATA went out with the previous
        mail's data. `then`: (sender, rcpt, raw) of the lane's next mail: with PIPELINING its
        envelope and DATA go out in the same write as this mail's data (RFC 2920 3.1: message
        content may be the first "command" of a group), one write and one wait per mail instead of
        two; `conn.envelope_sent` says whether they did. Raises ReplyError for a refused mail (the
        connection stays usable, a next envelope sent with its data still to be answered)."""
        sent, conn.envelope_sent = conn.envelope_sent, False
        lines = self._envelope(conn, sender, rcpt, raw) if not sent else ["MAIL", "RCPT", "DATA"]
        pipelining = "pipelining" in conn.extensions
        if sent:
            replies = [await conn.reply() for _ in lines]
        elif pipelining:
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
            follow = b""
            if then is not None and pipelining:
                try:
                    follow = "".join(f"{line}\r\n" for line in self._envelope(conn, *then)).encode("utf-8")
                except ReplyError:
                    follow = b""  # the next mail fails on its own turn
            conn.writer.write(body + b".\r\n" + follow)
            conn.envelope_sent = bool(follow)
            await conn.writer.drain()
            code, text = await conn.reply()
            if code != 250:
                if code == 421:
                    conn.close()  # closing: its next envelope is never answered
                raise ReplyError(code, text)
            return
        if len(codes) == 3 and codes[2] == 354:
            conn.close()  # DATA accepted after a failed envelope: only closing aborts it
        else:
            code, _ = await conn.command("RSET")
        failed = next((r for r in replies if r[0] not in (250, 251, 354)), replies[-1])
        raise ReplyError(*failed)

    def lanes_for(self, count: int) -> int:
        """Lanes for a batch of `count`: as many as the pool may grow to while it may grow (a step
        up needs lanes to give its connections to), the limit otherwise."""
        ceiling = self.sizer.ceiling.current()
        most = min(self.pool_max, ceiling or self.pool_max) if self.sizer.may_grow() else self.sizer.limit()
        return max(1, min(count, most))

    async def _send_lane(self, items, deadline: float, progress: Progress, ids: list[str] | None = None) -> list:
        out = Reported(progress)
        conn = await self._pool.acquire()
        try:
            for pos, (index, m, raw) in enumerate(items):
                # Checked before every mail, one whose envelope and DATA went out with the previous
                # one's data included: a stop (or the deadline) that came meanwhile still holds it
                # back. The `finally` below closes such a connection, which is what aborts a
                # transaction after DATA: nothing more is handed over once the stop is seen.
                rest = not_started(items[pos:], deadline, progress)
                if rest is not None:
                    out.extend(rest)
                    break
                sender = mail.envelope_from(m.from_addr)
                for attempt in (1, 2):
                    try:
                        if conn is None or conn.broken:
                            conn = await self._pool.connect(deadline, fresh=attempt > 1)
                        began = time.perf_counter()
                        # The next mail's envelope goes with this one's data when it may start now.
                        then = None
                        if pos + 1 < len(items) and not_started(items[pos + 1 : pos + 2], deadline, progress) is None:
                            following = items[pos + 1][1]
                            then = (mail.envelope_from(following.from_addr), following.to, items[pos + 1][2])
                        # asyncio.timeout, not wait_for: wait_for wraps each mail in a new task
                        async with asyncio.timeout(self.timeout):
                            await self._transaction(conn, sender, m.to, raw, then)
                        self._pool.delivered(time.perf_counter() - began)
                        message_id = ids[index] if ids is not None else mail.message_id_of(m)
                        out.append((index, SendResult(ok=True, message_id=message_id)))
                        break
                    except ReplyError as exc:
                        out.append((index, SendResult(ok=False, error=str(exc), permanent=500 <= exc.code < 600)))
                        if exc.code == 421 and conn is not None:
                            conn.close()
                        break
                    except (TransientError, PermanentError) as exc:  # (re)connect failed
                        if isinstance(exc, PermanentError):
                            raise
                        for index2, _, _ in items[pos:]:
                            out.append((index2, SendResult(ok=False, error=str(exc))))
                        return out
                    except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
                        # dropped idle connection: reopen once (a re-send carries the same Message-ID)
                        if conn is not None:
                            conn.close()
                        conn = None
                        if attempt == 2:
                            out.append((index, SendResult(ok=False, error=f"SMTP connection lost: {exc!r}")))
                    except Exception as exc:  # a bug or an odd reply: this mail retries later, the lane goes on
                        log.exception("unexpected error sending %s", m.idempotency_key)
                        if conn is not None:
                            conn.close()
                        conn = None
                        out.append((index, SendResult(ok=False, error=f"unexpected SMTP client error: {exc!r}")))
                        break
        finally:
            if conn is not None and conn.envelope_sent:
                conn.close()  # a next envelope nobody will answer (the lane ended on an error)
            self._pool.release(conn)
        return out

    async def _send_all(self, ready, deadline: float, progress: Progress, ids: list[str] | None = None) -> list:
        lanes = self.lanes_for(len(ready))
        chunks = [ready[k::lanes] for k in range(lanes)]
        done = await asyncio.gather(*(self._send_lane(c, deadline, progress, ids) for c in chunks))
        return [pair for chunk in done for pair in chunk]

    def send(self, ready, deadline: float, progress: Progress, ids: list[str] | None = None) -> list:
        """[(index, SendResult)] for [(index, mail, raw bytes)], from any thread (`ids`: each mail's
        Message-ID by index, as build_with_id gave it; None: computed again). No mail is started
        after `deadline` (time.monotonic()) or once `progress` asks to stop: those come back as
        transient failures or STOPPED. The calling thread polls `progress` while it waits."""
        if not self._thread.is_alive():
            raise TransientError("SMTP event loop thread is not running")
        future = asyncio.run_coroutine_threadsafe(self._send_all(ready, deadline, progress, ids), self._loop)
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
            self._pool.close()

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
