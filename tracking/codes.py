"""Tracking codes: versioned, authenticated, compact.

A code is `<version char><base64url(payload + mac)>`. The version is the first character, so every
format ever issued keeps its own decoder here forever (invariant I5: a code that was ever sent
resolves forever). tests/fixtures/tracking_codes.json holds golden codes of every version; a change
that breaks one of them fails CI.

Version "1" (current):
  click payload = varint(link_id) varint(subscriber_id, 0 = none)
  open  payload = kind byte ('d' digest / 'n' newsletter) varint(mail_id) varint(subscriber_id)
  mac = HMAC-SHA256(key, b"notify-<purpose>-v1\\x00" + payload)[:10]   (80 bits)

Signing uses SECRET_KEY; verification accepts SECRET_KEY and every SECRET_KEY_FALLBACKS entry so
mails sent before a key rotation keep working as long as the old key stays in the fallbacks.
The code carries ids only: the redirect target always comes from the email_links row.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from typing import NamedTuple

from app.platform import config, tokens

CURRENT_VERSION = "1"
MAX_CODE_LENGTH = 200
# fullmatch, never match with "$": "$" also matches before a trailing newline ("%0A" in a URL).
_B64_RE = re.compile(r"[A-Za-z0-9_-]+")
# What a code from a previous system may look like (app/cli/tracking.py imports only these). Anything
# else cannot be in legacy_link_codes: refused without a lookup. NUL and lone surrogates could not
# even be sent to Postgres.
LEGACY_CODE_RE = re.compile(r"[^\s/\x00\ud800-\udfff]{1,200}")
_MAC_LEN = 10
MAIL_KINDS = {"digest": b"d", "newsletter": b"n"}
_KIND_BY_BYTE = {v[0]: k for k, v in MAIL_KINDS.items()}


class Click(NamedTuple):
    link_id: int
    subscriber_id: int | None


class Open(NamedTuple):
    mail_kind: str
    mail_id: int
    subscriber_id: int | None


def _varint(n: int) -> bytes:
    if n < 0:
        raise ValueError("ids are never negative")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position); ValueError on truncated or oversized input."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_B64_VALUE = {c: i for i, c in enumerate(_B64_ALPHABET)}
_TO_STANDARD = str.maketrans("-_", "+/")


def _unb64(text: str) -> bytes | None:
    """Strict base64url: alphabet only, and canonical (the unused low bits of the last character
    must be zero), so each payload has exactly one code string."""
    if not _B64_RE.fullmatch(text):
        return None
    rem = len(text) % 4
    if rem == 1 or (rem == 2 and _B64_VALUE[text[-1]] & 0x0F) or (rem == 3 and _B64_VALUE[text[-1]] & 0x03):
        return None
    try:
        return binascii.a2b_base64(text.translate(_TO_STANDARD) + "=" * (-len(text) % 4))
    except binascii.Error:
        return None


def _mac(key: str, domain: bytes, payload: bytes) -> bytes:
    return tokens.hmac_sha256(key, domain, payload)[:_MAC_LEN]


def _sign(domain: bytes, payload: bytes) -> str:
    return CURRENT_VERSION + _b64(payload + _mac(config.get().secret_key, domain, payload))


def _verified_payload(domain: bytes, blob: bytes) -> bytes | None:
    if len(blob) <= _MAC_LEN:
        return None
    payload, given = blob[:-_MAC_LEN], blob[-_MAC_LEN:]
    for key in config.get().secret_keys:
        if hmac.compare_digest(_mac(key, domain, payload), given):
            return payload
    return None


_CLICK_V1 = b"notify-click-v1\x00"
_OPEN_V1 = b"notify-open-v1\x00"


def click_code(link_id: int, subscriber_id: int | None) -> str:
    return _sign(_CLICK_V1, _varint(int(link_id)) + _varint(int(subscriber_id or 0)))


def open_code(mail_kind: str, mail_id: int, subscriber_id: int | None) -> str:
    return _sign(_OPEN_V1, MAIL_KINDS[mail_kind] + _varint(int(mail_id)) + _varint(int(subscriber_id or 0)))


def _decode_click_v1(body: str) -> Click | None:
    blob = _unb64(body)
    payload = blob and _verified_payload(_CLICK_V1, blob)
    if not payload:
        return None
    try:
        link_id, pos = _read_varint(payload, 0)
        subscriber_id, pos = _read_varint(payload, pos)
    except ValueError:
        return None
    if pos != len(payload) or link_id == 0:
        return None
    return Click(link_id, subscriber_id or None)


def _decode_open_v1(body: str) -> Open | None:
    blob = _unb64(body)
    payload = blob and _verified_payload(_OPEN_V1, blob)
    if not payload:
        return None
    kind = _KIND_BY_BYTE.get(payload[0])
    try:
        mail_id, pos = _read_varint(payload, 1)
        subscriber_id, pos = _read_varint(payload, pos)
    except ValueError:
        return None
    if kind is None or pos != len(payload):
        return None
    return Open(kind, mail_id, subscriber_id or None)


# Every version ever issued, forever. Add a new version with a new character; never edit an old one.
CLICK_DECODERS = {"1": _decode_click_v1}
OPEN_DECODERS = {"1": _decode_open_v1}


def decode_click(code: str) -> Click | None:
    """The (link_id, subscriber_id) a versioned click code was issued for, or None if the code is
    not one of ours (unknown version, bad MAC under every key, malformed). Never touches the DB."""
    if not code or len(code) > MAX_CODE_LENGTH:
        return None
    decoder = CLICK_DECODERS.get(code[0])
    return decoder(code[1:]) if decoder else None


def is_legacy_shaped(code: str) -> bool:
    return LEGACY_CODE_RE.fullmatch(code) is not None


def decode_open(code: str) -> Open | None:
    if not code or len(code) > MAX_CODE_LENGTH:
        return None
    decoder = OPEN_DECODERS.get(code[0])
    return decoder(code[1:]) if decoder else None
