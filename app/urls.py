"""The one URL policy for links and images a producer puts in our mail (event `entity_url`,
`actor_avatar_url`, the same keys in `payload`): absolute http(s) only. The API refuses anything
else in the documented fields (422 naming the field); the digest drops it from payloads (never
rendered, never a link)."""
from __future__ import annotations

import re

MAX_URL = 2000
# Whitespace, quotes and angle brackets cannot be part of a URL in an attribute we write; a
# control character is never part of a real one.
_UNSAFE = re.compile(r'[\s"<>\x00-\x1f\x7f]')


def http_url(value) -> str:
    """The URL if it is an absolute http(s) URL we may render, else "" (javascript:, data:,
    relative paths, protocol-relative //host, non-strings, over MAX_URL characters)."""
    if not isinstance(value, str) or len(value) > MAX_URL:
        return ""
    value = value.strip()
    head = value[:8].lower()
    if not (head.startswith("https://") or head.startswith("http://")) or _UNSAFE.search(value):
        return ""
    host = value.split("://", 1)[1].split("/", 1)[0]
    return value if host and host != "@" and not host.startswith(("@", ":")) else ""
