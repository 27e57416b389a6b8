"""Building the MIME message every SMTP-like provider sends.

- multipart/alternative: text/plain first, text/html last (clients show the last part they can);
- Message-ID derived from the idempotency key, so a re-send after a crash carries the same id and
  receiving systems (and our tests) can tell it is the same mail;
- RFC 8058 one-click unsubscribe headers (List-Unsubscribe with the https URL, plus mailto: when
  UNSUBSCRIBE_MAILTO is set, and List-Unsubscribe-Post);
- DKIM signature (dkimpy) when DKIM_DOMAIN, DKIM_SELECTOR and DKIM_PRIVATE_KEY are set, covering
  both List-Unsubscribe headers as Gmail and Yahoo require of bulk senders; the RSA signature
  itself is computed by OpenSSL (the same bytes, ~8x less CPU: _openssl_rsa).
"""

from __future__ import annotations

import binascii
import email.headerregistry
import email.policy
import functools
import hashlib
import logging
import re
import secrets
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.asymmetric import utils as asymmetric_utils

from app.platform import addresses, config
from app.platform.providers.base import OutgoingMail

log = logging.getLogger("app.platform.mail")

# Headers the DKIM signature covers (only those present are signed; dkimpy skips absent ones).
DKIM_HEADERS = (
    b"from",
    b"to",
    b"subject",
    b"date",
    b"message-id",
    b"mime-version",
    b"content-type",
    b"list-unsubscribe",
    b"list-unsubscribe-post",
    b"reply-to",
)
MAX_HEADER_VALUE = 2000
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,60}$")
# Set by build() itself; a caller's header of these names would duplicate or override them.
_RESERVED = {
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "dkim-signature",
    "bcc",
    "cc",
}


class MailBuildError(ValueError):
    """The mail cannot be built (bad address, header injection attempt): a permanent error."""


def _address_of(from_addr: str) -> str:
    try:
        return parse_mailbox(from_addr)[1]
    except MailBuildError:
        return ""


def sender_domain(from_addr: str | None = None) -> str:
    settings = config.get()
    addr = _address_of(from_addr or settings.mail_from)
    return settings.dkim_domain or (addr.rsplit("@", 1)[1] if "@" in addr else "localhost")


_SAFE_KEY = re.compile(r"[A-Za-z0-9._-]{1,120}")  # a key message_id() keeps as it is (ours all are)


def message_id(idempotency_key: str, domain: str | None = None) -> str:
    """<digest-run-42.1a2b3c4d@example.com>: stable for a key; the short hash keeps a key with odd
    characters from producing an invalid id and makes ids of different installations distinct."""
    if _SAFE_KEY.fullmatch(idempotency_key):
        safe = idempotency_key  # what the character walk below gives for it, without walking
    else:
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


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # tab is folding whitespace, allowed
# Printable ASCII with no encoded-word marker and no leading/trailing/doubled blanks is written as
# it is: for such values under 78 columns that is byte-identical to the SMTP policy's output
# (tests/platform/test_address_policy.py proves it). List-Unsubscribe values stay on one line however long
# (RFC 5322 allows 998): the policy would turn a long URL into RFC 2047 encoded words, which mail
# clients do not decode there, and one-click unsubscribe would break.
_URL_HEADERS = {"list-unsubscribe", "list-unsubscribe-post"}
_PLAIN_VALUE = re.compile(r"[!-~](?:[!-~]| (?! ))*")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9]+(?: [A-Za-z0-9]+)*")  # a display name that needs no quoting
_POLICY = email.policy.SMTP


# Where str.splitlines() breaks a line beyond the ASCII controls: the email package folds header
# values there, so a display name holding one cannot be written as a header at all.
_UNICODE_LINE_BREAKS = re.compile("[\x85\u2028\u2029]")
_DISPLAY_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, separators


def one_line(text) -> str:
    """Display text (a recipient's name, a digest subject built from event titles) made safe for a
    header: line breaks (Unicode's too) and control characters become spaces. Such text is data,
    so it is cleaned rather than failing the recipient; a subject or header value handed to build()
    with a line break is refused instead (header injection)."""
    text = str(text or "")
    if _DISPLAY_UNSAFE.search(text) or "  " in text:
        return " ".join(_DISPLAY_UNSAFE.sub(" ", text).split())
    return text.strip()


def sender(from_addr: str | None = None) -> str:
    """The From value a mail goes out with (MAIL_FROM when it names none). A Unicode line or
    paragraph separator in its display name (a newsletter stored before the API refused them)
    becomes a space rather than failing every mail of the newsletter."""
    value = from_addr or config.get().mail_from
    return _UNICODE_LINE_BREAKS.sub(" ", value) if _UNICODE_LINE_BREAKS.search(value) else value


def _clean(value, name: str) -> str:
    value = str(value)
    if _CONTROL.search(value) or len(value) > MAX_HEADER_VALUE:
        raise MailBuildError(f"header {name} contains a line break or control character, or is too long")
    return value


def _header(name: str, value: str) -> bytes:
    """One header line, as the email package's SMTP policy writes it: RFC 2047 encoded words for
    non-ASCII text, folding at 78 columns, addresses parsed and re-quoted."""
    value = _clean(value, name)
    limit = 990 if name.lower() in _URL_HEADERS else 76
    if len(name) + len(value) < limit and "=?" not in value and _PLAIN_VALUE.fullmatch(value):
        return f"{name}: {value}\r\n".encode("ascii")
    try:
        stored = _POLICY.header_store_parse(name, value)[1]
        return _POLICY.fold_binary(name, stored)
    except Exception as exc:
        raise MailBuildError(f"header {name} cannot be encoded: {exc}") from exc


# An encoded word is at most 75 characters and a line holding one at most 76 (RFC 2047 2.);
# "=?utf-8?b?" + "?=" is 12 of them, base64 turns 3 bytes into 4.
_WORD_OVERHEAD = len("=?utf-8?b??=")


@functools.lru_cache(maxsize=256)
def _constant_header(name: str, value: str) -> bytes:
    """_header of a value many mails share (the sender, List-Unsubscribe-Post): encoded once."""
    return _header(name, value)


# Header values of build()'s caller that differ per mail: not worth keeping in _constant_header.
_PER_MAIL_HEADERS = {"list-unsubscribe"}


def _date_header(now: datetime | None) -> bytes:
    """The Date header; for the current time (now=None) encoded once a second: its text has no
    finer resolution."""
    global _date_cached
    if now is not None:
        return _header("Date", format_datetime(now))
    second = int(time.time())
    cached = _date_cached
    if cached[0] == second:
        return cached[1]
    value = _header("Date", format_datetime(datetime.fromtimestamp(second, UTC)))
    _date_cached = (second, value)
    return value


_date_cached: tuple[int, bytes] = (-1, b"")


def _text_header(name: str, value: str) -> bytes:
    """An unstructured header (the subject) without the email package, whose parser is slow once a
    subject is long or not ASCII (digest subjects name people and titles) and
    mangles some values (a literal "=?…?=" is decoded, blanks around encoded words are lost):
    plain ASCII words as they are, folded before 78 columns; any other text as base64 UTF-8
    encoded words (RFC 2047), never splitting a character, one per line, so every character and
    blank comes back exactly. tests/platform/test_mail.py parses the result back with the email package."""
    value = _clean(value, name)
    if "=?" not in value and _PLAIN_VALUE.fullmatch(value):
        if len(name) + len(value) < 76:
            return f"{name}: {value}\r\n".encode("ascii")
        lines, line = [], f"{name}:"
        for word in value.split(" "):
            if len(line) + 1 + len(word) > 78:
                if line == f"{name}:" or len(word) > 76:
                    break  # a word too long for a line: encoded words below
                lines.append(line)
                line = ""
            line += " " + word
        else:
            return ("\r\n".join([*lines, line]) + "\r\n").encode("ascii")
    data, words, start = value.encode("utf-8"), [], 0
    room = (76 - len(name) - 2 - _WORD_OVERHEAD) // 4 * 3  # bytes in the first line's word
    while start < len(data):
        end = min(start + room, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # never end inside a UTF-8 sequence
            end -= 1
        words.append("=?utf-8?b?" + binascii.b2a_base64(data[start:end], newline=False).decode("ascii") + "?=")
        start, room = end, (76 - 1 - _WORD_OVERHEAD) // 4 * 3
    return (f"{name}: " + "\r\n ".join(words or ["=?utf-8?b??="]) + "\r\n").encode("ascii")


def _utf8_header(name: str, value: str) -> bytes:
    """A header with a UTF-8 address, as the SMTPUTF8 policy writes it (RFC 6532): such a mail
    only goes to a relay that offered SMTPUTF8."""
    try:
        stored = email.policy.SMTPUTF8.header_store_parse(name, value)[1]
        return email.policy.SMTPUTF8.fold_binary(name, stored)
    except Exception as exc:
        raise MailBuildError(f"header {name} cannot be encoded: {exc}") from exc


def check_address(addr: str) -> str:
    """The address in the form to send to (app/platform/addresses.py has the policy)."""
    try:
        return addresses.sendable(_clean(addr, "address"))
    except addresses.AddressError as exc:
        raise MailBuildError(str(exc)) from exc


needs_smtputf8 = addresses.needs_smtputf8


@functools.lru_cache(maxsize=64)
def parse_mailbox(value: str) -> tuple[str, str]:
    """(display name, address) of exactly one mailbox ('News <news@example.com>' or a bare
    address), as the email package parses it; MailBuildError for anything else."""
    _clean(value, "From")
    try:
        header = _POLICY.header_factory("From", value)
    except Exception as exc:
        raise MailBuildError(f"{value!r} is not a mailbox: {exc}") from exc
    if len(header.addresses) != 1 or header.defects or not header.addresses[0].domain:
        raise MailBuildError(f"{value!r} must be exactly one address like 'News <news@example.com>'")
    address = header.addresses[0]
    if not (address.addr_spec.isascii() and address.username):
        raise MailBuildError(f"{value!r}: the sender address must be plain ASCII")
    return address.display_name, address.addr_spec


MAX_7BIT_LINE = 998  # RFC 5322 2.1.1, without the CRLF


def _part(subtype: str, body: str) -> bytes:
    """One text part with its headers, CRLF line ends. Plain ASCII with no line over 998 octets
    goes as it is (7bit); anything else as quoted-printable. binascii's quoted-printable is C but
    walks every byte (and "=" in every attribute of a digest's HTML becomes "=3D"); the ASCII check
    and the split cost far less. mail.ascii_html makes a rendered HTML part ASCII."""
    text = body.replace("\r\n", "\n").replace("\r", "\n") if "\r" in body else body
    if text.isascii() and "\0" not in text:
        data = text.encode("ascii")
        if len(data) <= MAX_7BIT_LINE or max(map(len, data.split(b"\n"))) <= MAX_7BIT_LINE:
            return _PART_HEADERS[subtype, "7bit"] + data.replace(b"\n", b"\r\n")
    return _PART_HEADERS[subtype, "quoted-printable"] + _qp(text)


def _qp(text: str) -> bytes:
    """quoted-printable with CRLF line ends, of text with \\n line ends (the email package's encoder is far slower)."""
    return binascii.b2a_qp(text.encode("utf-8"), quotetabs=False, istext=True).replace(b"\n", b"\r\n")


# Outside <style> and <script> (raw text: a reference there would show as it is written), every
# HTML parser reads a numeric character reference back as the character it names.
_RAW_TEXT = re.compile(r"<(style|script)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)


def ascii_html(html: str) -> str:
    """The same HTML document in ASCII: other characters as numeric character references (é as
    &#233;), so build() can send the part as 7bit instead of quoted-printable. Unchanged when a
    <style> or <script> element holds non-ASCII text."""
    if html.isascii() or any(not m.group(0).isascii() for m in _RAW_TEXT.finditer(html)):
        return html
    return html.encode("ascii", "xmlcharrefreplace").decode("ascii")


_TAG_TEXT = re.compile(r"</?(?:style|script)|</?[a-z]*\x00", re.IGNORECASE)


def renders_as_ascii(tokens) -> bool:
    """Whether a Mustache template (its tokens) rendered with its text and escaped values written in
    ASCII (mustache.Template(tokens, ascii=True)) is always ascii_html of the same template rendered
    as it is: it has no {{{raw}}} tag, and each <style> or <script> element lies whole inside its
    text, ASCII, with no tag in it (nor a tag name cut by one). Then a rendered document's raw-text
    elements are those of the text, and writing references is the same done per piece."""
    parts = []
    for kind, value in tokens:
        if kind == "no escape":
            return False
        if kind == "literal":
            parts.append(value)
        elif kind not in ("comment", "set delimiter"):
            parts.append("\x00")  # where a value or section goes
    skeleton = "".join(parts)
    if any("\x00" in m.group(0) or not m.group(0).isascii() for m in _RAW_TEXT.finditer(skeleton)):
        return False
    return not _TAG_TEXT.search(_RAW_TEXT.sub("", skeleton))


def _address(name: str, addr: str) -> str:
    if not name or _PLAIN_NAME.fullmatch(name):
        return f"{name} <{addr}>" if name else addr
    # Local part and domain given apart: parsing addr_spec refuses a non-ASCII local part (a
    # defect to the email package, an SMTPUTF8 address to us) once the name needs quoting.
    local, _, domain = addr.rpartition("@")
    return str(email.headerregistry.Address(display_name=name, username=local, domain=domain))


def validate(mail: OutgoingMail) -> None:
    """Everything build() would refuse about this mail, for providers that do not build MIME."""
    check_address(mail.to)
    parse_mailbox(sender(mail.from_addr))
    if _CONTROL.search(mail.subject):
        raise MailBuildError("the subject contains a line break or control character")
    for name, value in mail.headers.items():
        if not _NAME_RE.fullmatch(name) or name.lower() in _RESERVED:
            raise MailBuildError(f"invalid or reserved header name {name!r}")
        _clean(value, name)


def build(mail: OutgoingMail, now: datetime | None = None, dkim_headers: tuple[bytes, ...] = DKIM_HEADERS) -> bytes:
    """The wire bytes (CRLF line ends) of one mail, DKIM-signed when configured.

    Written by hand rather than through email.message.EmailMessage: that costs more per mail than
    rendering the whole digest, and the digest pipeline sends a thousand and more mails a second.
    tests/platform/test_mail.py parses the result with the email package to prove it equivalent."""
    return build_with_id(mail, now, dkim_headers)[0]


def build_with_id(
    mail: OutgoingMail, now: datetime | None = None, dkim_headers: tuple[bytes, ...] = DKIM_HEADERS
) -> tuple[bytes, str]:
    """build(), and the mail's Message-ID without angle brackets (message_id_of, not computed again)."""
    settings = config.get()
    from_header, domain = _sender_of(mail.from_addr, settings.mail_from, settings.dkim_domain)
    to_addr = check_address(mail.to)
    # "=_" can never occur in quoted-printable text, and 96 random bits cannot be guessed by whoever
    # wrote a 7bit part; they also keep the header under 78 columns
    boundary = b"=_" + secrets.token_hex(12).encode("ascii")
    parts = [
        from_header,
        _header("To", _address(one_line(mail.to_name), to_addr))
        if to_addr.isascii()
        else _utf8_header("To", _address(one_line(mail.to_name), to_addr)),
        _text_header("Subject", mail.subject),
        _date_header(now),
        _header("Message-ID", bracketed := message_id(mail.idempotency_key, domain)),
    ]
    for name, value in mail.headers.items():
        per_mail = _header_name(name)
        parts.append(_header(name, value) if per_mail else _constant_header(name, value))
    parts.append(_MIME_VERSION)
    # What _header writes for this value (plain ASCII, 72 columns), without checking it each time.
    parts.append(b'Content-Type: multipart/alternative; boundary="' + boundary + b'"\r\n\r\n')
    delimiter = b"--" + boundary + b"\r\n"
    parts += (delimiter, _part("plain", mail.text or ""), b"\r\n", delimiter, _part("html", mail.html), b"\r\n")
    parts.append(b"--" + boundary + b"--\r\n")
    return dkim_sign(b"".join(parts), dkim_headers), bracketed[1:-1]


@functools.lru_cache(maxsize=64)
def _sender_of(from_addr: str | None, mail_from: str, dkim_domain: str) -> tuple[bytes, str]:
    """(the From header, the Message-ID's domain) of a mail's from_addr under these settings;
    MailBuildError unless it is exactly one valid mailbox."""
    value = sender(from_addr)
    parse_mailbox(value)  # exactly one valid mailbox, or this mail fails
    return _header("From", value), sender_domain(value)


@functools.lru_cache(maxsize=64)
def _header_name(name: str) -> bool:
    """Whether a caller's header of this name differs per mail (not encoded once); MailBuildError
    for a name that is invalid or one build() sets itself."""
    if not _NAME_RE.fullmatch(name) or name.lower() in _RESERVED:
        raise MailBuildError(f"invalid or reserved header name {name!r}")
    return name.lower() in _PER_MAIL_HEADERS


_MIME_VERSION = _header("MIME-Version", "1.0")
_PART_HEADERS = {
    (subtype, encoding): _header("Content-Type", f'text/{subtype}; charset="utf-8"')
    + _header("Content-Transfer-Encoding", encoding)
    + b"\r\n"
    for subtype in ("plain", "html")
    for encoding in ("7bit", "quoted-printable")
}


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


def dkim_sign(raw: bytes, headers: tuple[bytes, ...] = DKIM_HEADERS) -> bytes:
    if not dkim_enabled():
        return raw
    import dkim  # slow to import: only processes that sign (DKIM_DOMAIN set) pay it

    s = config.get()
    key = _load_key(s.dkim_private_key)
    _openssl_rsa(dkim)
    signature = dkim.sign(
        raw,
        s.dkim_selector.encode(),
        s.dkim_domain.encode(),
        key,
        include_headers=list(headers),
        canonicalize=(b"relaxed", b"simple"),
    )
    return signature + raw


# dkimpy's parsed RSA keys as OpenSSL keys, by modulus (the signing primitive below).
_RSA_KEYS: dict[int, rsa.RSAPrivateKey] = {}


def _openssl_key(numbers: dict) -> rsa.RSAPrivateKey | None:
    key = _RSA_KEYS.get(numbers.get("modulus", 0))
    if key is None:
        try:
            public = rsa.RSAPublicNumbers(e=numbers["publicExponent"], n=numbers["modulus"])
            key = rsa.RSAPrivateNumbers(
                p=numbers["prime1"],
                q=numbers["prime2"],
                d=numbers["privateExponent"],
                dmp1=numbers["exponent1"],
                dmq1=numbers["exponent2"],
                iqmp=numbers["coefficient"],
                public_numbers=public,
            ).private_key()
        except (KeyError, TypeError, ValueError):
            return None  # dkimpy signs it (and reports what is wrong with it) as before
        if key.key_size < 1024:
            return None
        if len(_RSA_KEYS) < 8:
            _RSA_KEYS[public.n] = key
    return key


@functools.lru_cache(maxsize=1)
def _openssl_rsa(dkim_module) -> None:
    """dkimpy computes the RSA signature with Python's pow (about 8 ms a mail for a 2048-bit key,
    more than everything else a mail costs together) and parses the PEM key again for every mail.
    RSASSA-PKCS1-v1_5 is deterministic, so OpenSSL (the cryptography package) computes the same
    bytes in a fraction of that: dkimpy's primitive, a module global of dkim, is wrapped once to
    sign a SHA-256 digest with OpenSSL, anything else as before, and its key parser to parse each
    key once (canonicalization, the hashes and the header stay dkimpy's).
    tests/platform/test_mail.py compares both signatures."""
    parse = getattr(dkim_module, "parse_pem_private_key", None)
    original = getattr(dkim_module, "RSASSA_PKCS1_v1_5_sign", None)
    if parse is None or original is None:  # another dkimpy than the one this was written against
        log.warning("dkimpy has no parse_pem_private_key / RSASSA_PKCS1_v1_5_sign: DKIM is signed by dkimpy alone")
        return
    once = functools.lru_cache(maxsize=4)(parse)

    def parse_once(data):
        return dict(once(bytes(data)))  # each mail its own copy of the parsed numbers

    dkim_module.parse_pem_private_key = parse_once

    def sign(digest, private_key):
        key = _openssl_key(private_key) if isinstance(private_key, dict) else None
        if key is None or getattr(digest, "name", "").lower() != "sha256":
            return original(digest, private_key)
        return key.sign(digest.digest(), padding.PKCS1v15(), asymmetric_utils.Prehashed(hashes.SHA256()))

    sign.original = original  # type: ignore[attr-defined]
    dkim_module.RSASSA_PKCS1_v1_5_sign = sign


def envelope_from(from_addr: str | None = None) -> str:
    return _address_of(from_addr or config.get().mail_from) or "notify@localhost"


__all__ = [
    "MailBuildError",
    "ascii_html",
    "build",
    "build_with_id",
    "check_address",
    "envelope_from",
    "message_id",
    "one_line",
    "parse_mailbox",
    "renders_as_ascii",
    "sender",
    "unsubscribe_headers",
    "validate",
]
