"""A deadline for a request's headers: uvicorn's httptools protocol, plus HTTP_HEADER_TIMEOUT_SECONDS.

uvicorn has none of its own (0.54): `--timeout-keep-alive` runs only between requests and every
byte received cancels it, and httptools/h11 have no deadline either, so a client that trickles
header bytes, or connects and says nothing, holds its connection (and a slot of the process)
for as long as it likes. Here the clock starts when the connection opens and when the next request
on it begins, and stops once the headers are complete: a client that has not finished them by then
gets 408 and the connection is closed. A request body is not under this deadline (an upload may
be slow and legitimate); its size is bounded by the endpoints' limits.

The Procfile's web command selects it: `uvicorn … --http app.platform.slow_clients:HeaderDeadlineHttpTools`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.platform import config

log = logging.getLogger("app.platform.slow_clients")

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeaderDeadlineHttpTools(HttpToolsProtocol):
    # One timer per connection, re-armed when it fires, rather than one scheduled and cancelled per
    # request, which would cost the hot paths (clicks, opens) more than the rest of this protocol
    # does: here a request costs two attribute writes.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = config.get().http_header_timeout_seconds
        self._headers_since: float | None = None  # when the request now awaiting its headers began
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.header_timeout > 0:
            self._headers_since = self.loop.time()
            self._header_timer = self.loop.call_later(self.header_timeout, self._check_headers)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._headers_since is None:  # the first request's clock started when the connection opened
            self._headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._headers_since = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _check_headers(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self._headers_since is None or now - self._headers_since < self.header_timeout:
            since = now if self._headers_since is None else self._headers_since
            self._header_timer = self.loop.call_at(since + self.header_timeout, self._check_headers)
            return
        log.info(
            "closing a connection from %s: no complete request headers within %s s",
            self.client[0] if self.client else "?",
            self.header_timeout,
        )
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()
        else:  # a pipelined request trickles in while the one before is answered: close after that
            self.cycle.keep_alive = False
