"""Raw HTTP over a socket, for what a client library would not send (odd header bytes, half a
request, a body never sent) to a real server the test started (tests/conftest.py live_server)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def connect(base_url: str, timeout: float = 30) -> socket.socket:
    parts = urlsplit(base_url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout)


def exchange(base_url: str, request: bytes) -> bytes:
    """Send the bytes, read until the server closes (send `Connection: close`)."""
    with connect(base_url) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def closed_by_server(sock: socket.socket) -> bool:
    """Reads until the server closes the connection (a reset counts: it closed with our bytes unread)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
