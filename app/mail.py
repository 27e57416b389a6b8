"""Building the MIME message every SMTP-like provider sends.

- multipart/alternative: text/plain first, text/html last (clients show the last part they can);
- Message-ID derived from the idempotency key, so a re-send after a crash carries the same id and
  receiving systems (and our tests) can tell it is the same mail;
- RFC 8058 one-click unsubscribe headers (List-Unsubscribe with the https URL, plus mailto: when
  UNSUBSCRIBE_MAILTO is set, and List-Unsubscribe-Post);
- DKIM signature (dkimpy) when DKIM_DOMAIN, DKIM_SELECTOR and DKIM_PRIVATE_KEY are set, covering
  both List-Unsubscribe headers as Gmail and Yahoo require of bulk senders.
"""
from __future__ import annotations

import binascii
import functools
import hashlib
import logging
import re
import secrets
from email.header import Header
from email.utils import format_datetime, formataddr, parseaddr
from datetime import datetime, timezone
from pathlib import Path

from app import config
from app.providers.base import OutgoingMail
from app.subscribers import EMAIL_RE

log = logging.getLogger("app.mail")

# Headers the DKIM signature covers (only those present are signed; dkimpy skips absent ones).
DKIM_HEADERS = (b"from", b"to", b"subject", b"date", b"message-id", b"mime-version", b"content-type",
                b"list-unsubscribe", b"list-unsubscribe-post", b"reply-to")
MAX_HEADER_VALUE = 2000
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,60}$")
# Set by build() itself; a caller's header of these names would duplicate or override them.
_RESERVED = {"from", "to", "subject", "date", "message-id", "mime-version", "content-type",
             "content-transfer-encoding", "dkim-signature", "bcc", "cc"}


class MailBuildError(ValueError):
    """The mail cannot be built (bad address, header injection attempt): a permanent error."""


@functools.lru_cache(maxsize=64)
def _address_of(from_addr: str) -> str:
    return parseaddr(from_addr)[1]    # the email package's parser is slow: a few From values, cached


def sender_domain(from_addr: str | None = None) -> str:
    settings = config.get()
    addr = _address_of(from_addr or settings.mail_from)
    return settings.dkim_domain or (addr.rsplit("@", 1)[1] if "@" in addr else "localhost")


def message_id(idempotency_key: str, domain: str | None = None) -> str:
    """<digest-run-42.1a2b3c4d@example.com>: stable for a key; the short hash keeps a key with odd
    characters from producing an invalid id and makes ids of different installations distinct."""
    safe = "".join(c if c.isalnum() or c in "-._" else "-" for c in idempotency_key)[:120]
    digest = hashlib.sha256(f"{config.get().secret_key}:{idempotency_key}".encode()).hexdigest()[:12]
    return f"<{safe}.{digest}@{domain or sender_domain()}>"


def message_id_of(mail: OutgoingMail) -> str:
    """The Message-ID build() gives this mail, without angle brackets (SendResult.message_id)."""
    return message_id(mail.idempotency_key, sender_domain(mail.from_addr)).strip("<>")


def unsubscribe_headers(unsubscribe_url: str) -> dict:
    """RFC 8058 headers for a one-click unsubscribe URL (https://…/u/TOKEN)."""
    targets = [f"<{unsubscribe_url}>"]
    mailto = config.get().unsubscribe_mailto
    if mailto:
        targets.append(f"<{mailto if mailto.startswith('mailto:') else 'mailto:' + mailto}>")
    return {"List-Unsubscribe": ", ".join(targets), "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def _clean(value: str, name: str) -> str:
    value = str(value)
    if "\r" in value or "\n" in value or len(value) > MAX_HEADER_VALUE:
        raise MailBuildError(f"header {name} contains a line break or is too long")
    return value


def _header(name: str, value: str) -> bytes:
    """One header line; non-ASCII values as RFC 2047 encoded words, folded by email.header."""
    value = _clean(value, name)
    if value.isascii() and len(name) + len(value) < 990:
        return f"{name}: {value}\r\n".encode()
    encoded = Header(value, "utf-8", header_name=name).encode(linesep="\r\n")
    return f"{name}: {encoded}\r\n".encode()


def _qp(body: str) -> bytes:
    """quoted-printable with CRLF line ends (binascii is C; the email package's encoder is ~10x slower)."""
    data = body.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")
    return binascii.b2a_qp(data, quotetabs=False, istext=True).replace(b"\n", b"\r\n")


def _address(name: str, addr: str) -> str:
    return formataddr((name, addr)) if name else addr


def build(mail: OutgoingMail, now: datetime | None = None) -> bytes:
    """The wire bytes (CRLF line ends) of one mail, DKIM-signed when configured.

    Written by hand rather than through email.message.EmailMessage: that costs ~1.7 ms per mail,
    more than rendering the whole digest, and the digest pipeline sends 1000+ mails a second per
    core. tests/test_mail.py parses the result with the email package to prove it equivalent."""
    settings = config.get()
    from_addr = _clean(mail.from_addr or settings.mail_from, "From")
    to_addr = _clean(mail.to, "To").strip()
    if not EMAIL_RE.fullmatch(to_addr):
        raise MailBuildError(f"invalid recipient address {to_addr!r}")
    boundary = "=_" + secrets.token_hex(16)  # "=_" can never occur in quoted-printable text
    parts = [
        _header("From", from_addr),
        _header("To", _address(_clean(mail.to_name, "To"), to_addr)),
        _header("Subject", mail.subject),
        _header("Date", format_datetime(now or datetime.now(timezone.utc))),
        _header("Message-ID", message_id(mail.idempotency_key, sender_domain(from_addr))),
    ]
    for name, value in mail.headers.items():
        if not _NAME_RE.fullmatch(name) or name.lower() in _RESERVED:
            raise MailBuildError(f"invalid or reserved header name {name!r}")
        parts.append(_header(name, value))
    parts.append(b"MIME-Version: 1.0\r\n")
    parts.append(f'Content-Type: multipart/alternative; boundary="{boundary}"\r\n\r\n'.encode())
    for subtype, body in (("plain", mail.text or ""), ("html", mail.html)):
        parts.append(f"--{boundary}\r\nContent-Type: text/{subtype}; charset=\"utf-8\"\r\n"
                     f"Content-Transfer-Encoding: quoted-printable\r\n\r\n".encode())
        parts.append(_qp(body))
        parts.append(b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return dkim_sign(b"".join(parts))


@functools.lru_cache(maxsize=4)
def _load_key(value: str) -> bytes:
    if value.lstrip().startswith("-----BEGIN"):
        return value.replace("\\n", "\n").encode()
    path = Path(value).expanduser()
    if not path.is_file():
        raise MailBuildError("DKIM_PRIVATE_KEY is neither a PEM key nor a readable file path")
    return path.read_bytes()


def dkim_enabled() -> bool:
    s = config.get()
    return bool(s.dkim_domain and s.dkim_selector and s.dkim_private_key)


def dkim_sign(raw: bytes) -> bytes:
    if not dkim_enabled():
        return raw
    import dkim

    s = config.get()
    signature = dkim.sign(raw, s.dkim_selector.encode(), s.dkim_domain.encode(), _load_key(s.dkim_private_key),
                          include_headers=list(DKIM_HEADERS), canonicalize=(b"relaxed", b"simple"))
    return signature + raw


def envelope_from(from_addr: str | None = None) -> str:
    return _address_of(from_addr or config.get().mail_from) or "notify@localhost"


__all__ = ["build", "message_id", "unsubscribe_headers", "envelope_from", "MailBuildError"]
