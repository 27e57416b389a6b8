"""The one address policy (API validation, sending and identity share it).

Accepted by the API: `local@domain` with no controls, spaces or header specials (EMAIL_PATTERN,
also the documented OpenAPI pattern); Unicode allowed in both parts; the domain must be a valid
internationalised domain name (IDNA, UTS 46 processing), so that every accepted address has one
canonical form. Sent as: an ASCII local part with a Unicode domain goes out with the domain
IDNA-encoded (xn--…, the same A-label the canonical form holds), which every relay and ESP
accepts. Anything still non-ASCII (a Unicode local part, or a domain IDNA cannot encode, stored
before the API checked domains) needs SMTPUTF8 (RFC 6531): the SMTP provider uses it when the
relay offers it and refuses that recipient alone when not; SendGrid (no SMTPUTF8) refuses that
recipient alone.

Identity (`canonical`, README "Address identity"): two spellings are one address when their
canonical forms are equal. Domain: UTS 46 to ASCII (case, full-width forms and U-labels map to the
lower-case A-label). Local part: NFKC, then case-folded. The canonical form is what suppressions
hold and what every suppression check, webhook, erasure and duplicate check compares
(subscribers.canonical_email, webhook_events.canonical_email); mail still goes to the address as
given.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import idna

# Deliberately loose (the provider is the real judge) but nothing that can break a header.
# U+2028/U+2029 too: the email package folds a header at them, so no mail to such an address builds.
_LOCAL = r"[^@\x00-\x20\x7f-\xa0\u2028\u2029<>\",;()\[\]\\:]"  # no controls, spaces or header specials
_DOMAIN = r"[^@\x00-\x20\x7f-\xa0\u2028\u2029<>\",;()\[\]\\:'.]"
EMAIL_PATTERN = rf"^{_LOCAL}+@{_DOMAIN}+(\.{_DOMAIN}+)+$"
EMAIL_RE = re.compile(EMAIL_PATTERN)


class AddressError(ValueError):
    pass


@lru_cache(maxsize=8192)  # a few domains carry most mail; the codec costs microseconds a call
def _a_labels(domain: str) -> str | None:
    """The domain by UTS 46 to ASCII (non-transitional: ß stays ß), or None if it is not IDNA."""
    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        return None


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()  # what the branch below gives for ASCII, without its cost
    # NFKC again after the fold: case folding can produce a sequence NFKC would compose
    # differently, and the canonical form must be canonical of itself.
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def canonical(addr: str) -> str:
    """The identity of an address: local part NFKC and case-folded, domain by UTS 46 to ASCII
    (`Ana@Bücher.example`, `ana@xn--bcher-kva.example` and full-width `ａｎａ@bücher.example` are all
    `ana@xn--bcher-kva.example`). Never raises: a domain that is not IDNA (only in rows stored
    before the API checked domains, or in a webhook event) is folded like a local part; a string
    without `@` is folded whole. For an ASCII address this is exactly its lower-case form
    (migration 0600's trigger relies on it; tests/subscribers/test_address_identity.py proves it)."""
    local, at, domain = addr.rpartition("@")
    if not at:
        return _fold(addr)
    return f"{_fold(local)}@{_a_labels(domain) or _fold(domain)}"


def check_domain(addr: str) -> None:
    """AddressError unless the domain of this (pattern-valid) address is a valid IDNA name."""
    domain = addr.rpartition("@")[2]
    if _a_labels(domain) is None:
        raise AddressError(f"the domain {domain!r} is not a valid internationalised domain name (IDNA)")


def sendable(addr: str) -> str:
    """The form to send to (IDNA domain when the local part is ASCII); AddressError if none."""
    if not EMAIL_RE.fullmatch(addr):
        raise AddressError(f"invalid address {addr!r}")
    local, _, domain = addr.rpartition("@")
    if domain.isascii() or not local.isascii():
        return addr  # SMTPUTF8 carries U-labels as they are (RFC 6531 3.3)
    a_labels = _a_labels(domain)
    return f"{local}@{a_labels}" if a_labels else addr  # not IDNA: only an SMTPUTF8 relay can judge it


def needs_smtputf8(addr: str) -> bool:
    return not addr.isascii()
