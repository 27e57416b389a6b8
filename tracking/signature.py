"""SendGrid Signed Event Webhook verification.

SendGrid signs `timestamp header + raw body bytes` with ECDSA P-256 / SHA-256; the signature header
is base64 DER. The public key (SENDGRID_WEBHOOK_PUBLIC_KEY) is shown in the SendGrid console as
base64 DER (SubjectPublicKeyInfo); a PEM block is accepted too. A timestamp outside
SENDGRID_WEBHOOK_MAX_AGE_SECONDS (either direction) is refused so a captured request cannot be
replayed later.

The headers are checked before the body is read (check_headers, then verify_body): a request
with no signature, a malformed one or a stale timestamp costs no body bytes, whatever it declares.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from app.platform.validation import plain_int

SIGNATURE_HEADER = "x-twilio-email-event-webhook-signature"
TIMESTAMP_HEADER = "x-twilio-email-event-webhook-timestamp"
# A DER ECDSA P-256 signature is at most 72 bytes: 96 characters of base64. Longer is not one.
MAX_SIGNATURE_CHARS = 128


class SignatureError(Exception):
    """Why a request is refused (403); the message is safe to return."""


@lru_cache(maxsize=4)
def load_public_key(text: str) -> ec.EllipticCurvePublicKey:
    text = text.strip()
    try:
        if "BEGIN PUBLIC KEY" in text:
            key = load_pem_public_key(text.encode())
        else:
            key = load_der_public_key(base64.b64decode("".join(text.split()), validate=True))
    except (ValueError, binascii.Error, TypeError) as exc:
        raise ValueError(f"SENDGRID_WEBHOOK_PUBLIC_KEY is not a base64 DER or PEM public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("SENDGRID_WEBHOOK_PUBLIC_KEY must be an ECDSA P-256 key")
    return key


@dataclass(frozen=True)
class SignedHeaders:
    signature: bytes  # DER
    timestamp: str  # ASCII digits, as signed


def check_headers(
    signature: str | None, timestamp: str | None, max_age_seconds: int, now: float | None = None
) -> SignedHeaders:
    """Everything that can be checked before the body is read: both headers present, the timestamp
    plain ASCII digits inside the window, the signature base64 of a DER ECDSA signature.
    SignatureError otherwise."""
    if not signature or not timestamp:
        raise SignatureError("missing signature or timestamp header")
    ts = timestamp.strip()
    seconds = plain_int(ts, 12)
    if seconds is None:
        raise SignatureError("timestamp header is not a unix time")
    if max_age_seconds > 0 and abs((now if now is not None else time.time()) - seconds) > max_age_seconds:
        raise SignatureError("timestamp outside the accepted window")
    signature = signature.strip()
    try:
        if len(signature) > MAX_SIGNATURE_CHARS:
            raise ValueError("too long")
        der = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("signature is not base64") from None
    try:
        decode_dss_signature(der)
    except ValueError:
        raise SignatureError("signature is not a DER ECDSA signature") from None
    return SignedHeaders(der, ts)


def verify_body(public_key: str, headers: SignedHeaders, body: bytes) -> None:
    """Return if `body` is what was signed; raise SignatureError otherwise."""
    try:
        load_public_key(public_key).verify(
            headers.signature, headers.timestamp.encode() + body, ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature:
        raise SignatureError("signature does not match") from None


def verify(
    public_key: str,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    max_age_seconds: int,
    now: float | None = None,
) -> None:
    """Return if the request is authentic and fresh; raise SignatureError otherwise."""
    verify_body(public_key, check_headers(signature, timestamp, max_age_seconds, now), body)
