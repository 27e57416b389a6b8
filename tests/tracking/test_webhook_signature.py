"""SendGrid signed event webhook verification: SendGrid's published test vectors + our own keys."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tracking import signature

# From sendgrid/sendgrid-python test/unit/test_eventwebhook.py (SendGrid's own library tests).
SG_PUBLIC_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw"
    "+2fNNRaINXvVpiglSI8eNEc6wEA3F+g=="
)
SG_SIGNATURE = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM="
SG_TIMESTAMP = "1600112502"
SG_PAYLOAD = (
    json.dumps(
        [
            {
                "email": "hello@world.com",
                "event": "dropped",
                "reason": "Bounced Address",
                "sg_event_id": "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
                "sg_message_id": "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0",
                "smtp-id": "<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>",
                "timestamp": 1600112492,
            }
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    + "\r\n"
)
SG_OTHER_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDth"
    "vj+y7GjUuFDb/R1NGe1OPzpA=="
)
# The older vector of the same library (test/test_eventwebhook.py): a single object payload.
SG2_PUBLIC_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlv"
    "FYPAZFceEu/1FwCM/QmGUhA=="
)
SG2_SIGNATURE = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0="
SG2_TIMESTAMP = "1588788367"
SG2_PAYLOAD = json.dumps(
    {"event": "test_event", "category": "example_payload", "message_id": "message_id"},
    sort_keys=True,
    separators=(",", ":"),
)


def test_sendgrid_published_vector_verifies():
    signature.verify(SG_PUBLIC_KEY, SG_PAYLOAD.encode(), SG_SIGNATURE, SG_TIMESTAMP, 0)
    signature.verify(SG2_PUBLIC_KEY, SG2_PAYLOAD.encode(), SG2_SIGNATURE, SG2_TIMESTAMP, 0)


@pytest.mark.parametrize(
    "key, payload, sig, ts",
    [
        (SG_OTHER_KEY, SG_PAYLOAD, SG_SIGNATURE, SG_TIMESTAMP),  # wrong key
        (SG_PUBLIC_KEY, "payload", SG_SIGNATURE, SG_TIMESTAMP),  # tampered body
        (SG_PUBLIC_KEY, SG_PAYLOAD.rstrip(), SG_SIGNATURE, SG_TIMESTAMP),  # raw bytes matter
        (SG_PUBLIC_KEY, SG_PAYLOAD, SG2_SIGNATURE, SG_TIMESTAMP),  # someone else's signature
        (SG_PUBLIC_KEY, SG_PAYLOAD, SG_SIGNATURE, "1600112503"),  # other timestamp
        (SG_PUBLIC_KEY, SG_PAYLOAD, SG_SIGNATURE, "timestamp"),
        (SG_PUBLIC_KEY, SG_PAYLOAD, "not base64!", SG_TIMESTAMP),
        (SG_PUBLIC_KEY, SG_PAYLOAD, "", SG_TIMESTAMP),
        (SG_PUBLIC_KEY, SG_PAYLOAD, SG_SIGNATURE, None),
    ],
)
def test_published_vector_negative_cases(key, payload, sig, ts):
    with pytest.raises(signature.SignatureError):
        signature.verify(key, payload.encode(), sig, ts, 0)


def test_stale_timestamp_is_refused_even_with_a_valid_signature():
    with pytest.raises(signature.SignatureError, match="window"):
        signature.verify(
            SG_PUBLIC_KEY, SG_PAYLOAD.encode(), SG_SIGNATURE, SG_TIMESTAMP, 600, now=int(SG_TIMESTAMP) + 601
        )
    signature.verify(SG_PUBLIC_KEY, SG_PAYLOAD.encode(), SG_SIGNATURE, SG_TIMESTAMP, 600, now=int(SG_TIMESTAMP) + 599)


def test_generated_key_pair_der_and_pem():
    private = ec.generate_private_key(ec.SECP256R1())
    der = base64.b64encode(
        private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).decode()
    pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    body, ts = b'[{"event":"open"}]', "1700000000"
    sig = base64.b64encode(private.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))).decode()
    for key in (der, pem):
        signature.verify(key, body, sig, ts, 60, now=1700000010)
        with pytest.raises(signature.SignatureError):
            signature.verify(key, body + b" ", sig, ts, 60, now=1700000010)


def test_a_key_that_is_not_p256_is_a_configuration_error():
    with pytest.raises(ValueError):
        signature.load_public_key("bm90IGEga2V5")
    other = (
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    with pytest.raises(ValueError, match="P-256"):
        signature.load_public_key(other)
