"""A real TCP proxy in front of Postgres that a test can cut and restore: what a Postgres restart
looks like from the application's side (open connections dropped, new ones refused, then back)."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse, urlunparse


class TcpProxy:
    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432):
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    @classmethod
    def for_url(cls, url: str) -> tuple[TcpProxy, str]:
        """A proxy to the Postgres of `url`, and the same URL pointing at the proxy."""
        parsed = urlparse(url)
        proxy = cls(parsed.hostname or "127.0.0.1", parsed.port or 5432)
        auth = f"{parsed.username}@" if parsed.username else ""
        return proxy, urlunparse(parsed._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until restore()."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
            except OSError:
                pass
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for s in (source, target):
            # Shut down before closing: the other direction's thread may be blocked in recv() on this
            # socket, and on Linux a close() alone neither wakes it nor sends FIN while it is blocked,
            # so the application's end would wait for an answer forever (and cut() would then find
            # the socket already closed and be unable to shut it down).
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
