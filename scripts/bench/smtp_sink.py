"""A fast loopback SMTP sink for benchmarks: accepts everything, optionally delays each message.

    python scripts/bench/smtp_sink.py --port 2525 --delay-ms 50 [--expect 20000]

Plain asyncio protocol (uvloop when installed) rather than aiosmtpd, so the sink's own CPU cost —
it shares the machine with the workers being measured — stays small. The delay is applied to the
reply to the end of DATA (a real ESP's per-message round trip) without blocking other connections.
Counts messages, message bytes (the DATA payload, dot-stuffed as sent, without the final dot),
wire bytes (everything the clients sent: commands and data), connections opened and the most open
at once (how many the clients' pools held). With --expect N it prints
`reached N <CLOCK_MONOTONIC seconds>` the moment the N-th message's data has arrived; SIGUSR1 prints a
`stats {json}` line; when stopped (SIGTERM / SIGINT) it prints the stats line, then
`received <count>` as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

received = 0
message_bytes = 0
wire_bytes = 0
expect = 0
connections = 0  # opened so far
open_connections = 0
peak_connections = 0  # most open at once


class SinkProtocol(asyncio.Protocol):
    def __init__(self, delay: float):
        self.delay = delay
        self.buf = b""
        self.in_data = False

    def connection_made(self, transport):
        global connections, open_connections, peak_connections
        connections += 1
        open_connections += 1
        peak_connections = max(peak_connections, open_connections)
        self.transport = transport
        transport.write(b"220 bench-sink ESMTP\r\n")

    def connection_lost(self, exc):
        global open_connections
        open_connections -= 1

    def _reply(self, line: bytes):
        if not self.transport.is_closing():
            self.transport.write(line)

    def data_received(self, data: bytes):
        global received, message_bytes, wire_bytes
        wire_bytes += len(data)
        self.buf += data
        while True:
            if self.in_data:
                end = self.buf.find(b"\r\n.\r\n")
                if end < 0:
                    return
                message_bytes += end + 2
                self.buf = self.buf[end + 5 :]
                self.in_data = False
                received += 1
                if received == expect:
                    print(f"reached {received} {time.monotonic():.6f}", flush=True)
                if self.delay:
                    asyncio.get_running_loop().call_later(self.delay, self._reply, b"250 OK queued\r\n")
                else:
                    self._reply(b"250 OK queued\r\n")
                continue
            end = self.buf.find(b"\r\n")
            if end < 0:
                if len(self.buf) > 4096:
                    self.transport.close()
                return
            line, self.buf = self.buf[:end], self.buf[end + 2 :]
            verb = line[:4].upper()
            if verb == b"EHLO":
                self._reply(b"250-bench-sink\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n")
            elif verb == b"DATA":
                self.in_data = True
                self._reply(b"354 end with <CRLF>.<CRLF>\r\n")
            elif verb == b"QUIT":
                self._reply(b"221 bye\r\n")
                self.transport.close()
                return
            else:  # HELO, MAIL, RCPT, RSET, NOOP
                self._reply(b"250 OK\r\n")


def stats_line() -> str:
    return "stats " + json.dumps(
        {
            "received": received,
            "message_bytes": message_bytes,
            "wire_bytes": wire_bytes,
            "connections": connections,
            "peak_connections": peak_connections,
        }
    )


async def serve(host: str, port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SinkProtocol(delay), host, port, backlog=1024, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(stats_line(), flush=True))
    print("ready", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2525)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--expect", type=int, default=0, help="print `reached N <monotonic time>` at the N-th message")
    args = parser.parse_args()
    global expect
    expect = args.expect
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("the bench sink listens on loopback only")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port, args.delay_ms / 1000.0))
    print(stats_line(), flush=True)
    print(f"received {received}", flush=True)


if __name__ == "__main__":
    main()
