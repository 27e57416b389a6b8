"""SendGrid Signed Event Webhook verification.

SendGrid signs `timestamp header + raw body bytes` with ECDSA P-256 / SHA-256; the signature header
is base64 DER. The public key (SENDGRID_WEBHOOK_PUBLIC_KEY) is shown in the SendGrid console as
base64 DER (SubjectPublicKeyInfo); a PEM block is accepted too. A timestamp outside
SENDGRID_WEBHOOK_MAX_AGE_SECONDS (either direction) is refused so a captured request cannot be
replayed later.
"""
from __future__ import annotations

import base64
import binascii
import time
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

SIGNATURE_HEADER = "x-twilio-email-event-webhook-signature"
TIMESTAMP_HEADER = "x-twilio-email-event-webhook-timestamp"


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


def verify(public_key: str, body: bytes, signature: str | None, timestamp: str | None,
           max_age_seconds: int, now: float | None = None) -> None:
    """Return if the request is authentic and fresh; raise SignatureError otherwise."""
    if not signature or not timestamp:
        raise SignatureError("missing signature or timestamp header")
    ts = timestamp.strip()
    if not ts.isdigit() or len(ts) > 12:
        raise SignatureError("timestamp header is not a unix time")
    if max_age_seconds > 0 and abs((now if now is not None else time.time()) - int(ts)) > max_age_seconds:
        raise SignatureError("timestamp outside the accepted window")
    try:
        sig = base64.b64decode(signature.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("signature is not base64") from None
    try:
        load_public_key(public_key).verify(sig, ts.encode() + body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise SignatureError("signature does not match") from None
