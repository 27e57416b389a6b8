"""The one address policy (API validation and sending share it).

Accepted by the API: `local@domain` with no controls, spaces or header specials (EMAIL_PATTERN,
also the documented OpenAPI pattern); Unicode allowed in both parts. Sent as: an ASCII local part
with a Unicode domain goes out with the domain IDNA-encoded (xn--…), which every relay and ESP
accepts. Anything still non-ASCII (a Unicode local part, or a domain IDNA cannot encode) needs
SMTPUTF8 (RFC 6531): the SMTP provider uses it when the relay offers it and refuses that recipient
alone when not; SendGrid (no SMTPUTF8) refuses that recipient alone.
"""
from __future__ import annotations

import re

# Deliberately loose (the provider is the real judge) but nothing that can break a header.
# U+2028/U+2029 too: the email package folds a header at them, so no mail to such an address builds.
_LOCAL = r"[^@\x00-\x20\x7f-\xa0\u2028\u2029<>\",;()\[\]\\:]"  # no controls, spaces or header specials
_DOMAIN = r"[^@\x00-\x20\x7f-\xa0\u2028\u2029<>\",;()\[\]\\:'.]"
EMAIL_PATTERN = rf"^{_LOCAL}+@{_DOMAIN}+(\.{_DOMAIN}+)+$"
EMAIL_RE = re.compile(EMAIL_PATTERN)


class AddressError(ValueError):
    pass


def sendable(addr: str) -> str:
    """The form to send to (IDNA domain when the local part is ASCII); AddressError if none."""
    if not EMAIL_RE.fullmatch(addr):
        raise AddressError(f"invalid address {addr!r}")
    local, _, domain = addr.rpartition("@")
    if domain.isascii() or not local.isascii():
        return addr                     # SMTPUTF8 carries U-labels as they are (RFC 6531 3.3)
    try:
        return f"{local}@{domain.encode('idna').decode('ascii')}"
    except UnicodeError:
        return addr                     # not an IDNA name: only an SMTPUTF8 relay can judge it


def needs_smtputf8(addr: str) -> bool:
    return not addr.isascii()
