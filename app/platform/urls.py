"""The one URL policy for links and images a producer puts in our mail (event `entity_url`,
`actor_avatar_url`, the same keys in `payload`): absolute http(s) only. The API refuses anything
else in the documented fields (422 naming the field); the digest drops it from payloads (never
rendered, never a link)."""

from __future__ import annotations

import re

MAX_URL = 2000
# An absolute http(s) URL with a host, and nothing that could leave a quoted attribute or a line:
# no whitespace, quotes, angle brackets or control characters. The same pattern documents and
# checks the API fields (digest/ingest.py), so the schema and the check cannot disagree: explicit
# classes, no \s (Python's also matches U+0085 and U+001C-U+001F, ECMA-262's does not). Excluded:
# C0 and C1 controls, space, NBSP and every other Unicode space or line separator, the BOM.
_NOT_IN_URL = '"<>\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff'
PATTERN = f"^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@:{_NOT_IN_URL}][^{_NOT_IN_URL}]*$"
RULE = "must be an absolute http(s) URL (at most 2000 characters, no spaces or quotes)"
_URL = re.compile(PATTERN)


def http_url(value: object) -> str:
    """The URL (stripped) if it is an absolute http(s) URL we may render, else "" (javascript:,
    data:, relative paths, protocol-relative //host, no host, non-strings, over MAX_URL characters)."""
    if not isinstance(value, str) or len(value) > MAX_URL:
        return ""
    value = value.strip()
    return value if _URL.fullmatch(value) else ""
