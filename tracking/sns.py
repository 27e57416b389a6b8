"""Amazon SNS messages verified before anything in them is trusted (what /webhooks/ses receives).

A message is refused (SnsError, 403) unless, in this order, every check passes:
  * `Type` is Notification, SubscriptionConfirmation or UnsubscribeConfirmation and every field the
    signature covers is a string;
  * its `TopicArn` is in SES_SNS_TOPIC_ARNS (checked first: a stranger's topic costs no fetch);
  * `SignatureVersion` is 1 (SHA1withRSA) or 2 (SHA256withRSA);
  * `SigningCertURL` is `https`, on a host `sns.<region>.amazonaws.com` (`.com.cn` in China), with
    a path ending `.pem`, no user, port or query: anything else (`s3.amazonaws.com`, where anyone can
    publish a file, or `sns.evil.example`) is how a forger would bring their own key;
  * `Timestamp` is at most SNS_MAX_AGE_SECONDS old and not more than five minutes ahead;
  * the signature verifies with that certificate's key over AWS's string to sign: `Key\\nValue\\n`
    for Message, MessageId, Subject (if present), Timestamp, TopicArn, Type of a Notification, and
    Message, MessageId, SubscribeURL, Timestamp, Token, TopicArn, Type of a confirmation.

Certificates: fetched over HTTPS (certificate and host checked by httpx) once per URL and kept in
process (bounded), or, with SNS_SIGNING_CERT_FILE, read from that file and never fetched (an
offline deployment, and the tests: they sign with a key they make). A certificate past its
validity is not used (a cached one is fetched again once it expires).

A SubscriptionConfirmation of an allowed topic is confirmed by a GET of its SubscribeURL (signed,
and on an SNS host by the same rule); nothing else is ever fetched from what a message says.

`transport` is the one seam for tests: an httpx transport that carries the requests to a local
server. The URL rules run before it is reached, so tests exercise the production rules.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from app.platform.negcache import NegativeCache

log = logging.getLogger("tracking.sns")

SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
FIELDS = {
    "Notification": NOTIFICATION_FIELDS,
    "SubscriptionConfirmation": CONFIRMATION_FIELDS,
    "UnsubscribeConfirmation": CONFIRMATION_FIELDS,
}
OPTIONAL = {"Subject"}
HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
MAX_FUTURE_SECONDS = 300
MAX_CERT_BYTES = 64 * 1024  # an SNS certificate is about 2 KB
MAX_CACHED_CERTS = 16  # AWS rotates a region's certificate now and then; a handful of URLs is plenty
FETCH_TIMEOUT_SECONDS = 5.0
# A URL that failed is not fetched again for a minute: a flood of messages naming made-up .pem paths
# on an SNS host costs one fetch each, not one per message (and SNS retries a real one later).
FAILED_URL_SECONDS = 60.0
MAX_SIGNATURE_CHARS = 1024  # base64 of an RSA-4096 signature is 684


class SnsError(Exception):
    """Why a message is refused; the text is safe to return."""


@dataclass(frozen=True)
class Message:
    """A verified SNS message."""

    type: str
    message_id: str
    topic_arn: str
    message: str
    timestamp: str
    subscribe_url: str | None


def check_sns_url(url: str, what: str, pem: bool) -> str:
    """`url` if it is an https URL on an SNS host (a `.pem` path for a certificate); SnsError otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SnsError(f"{what} is not a URL") from None
    if parts.scheme != "https":
        raise SnsError(f"{what} must be https")
    if parts.username is not None or parts.password is not None or port not in (None, 443):
        raise SnsError(f"{what} must not carry credentials or a port")
    if not SNS_HOST.match(parts.hostname or ""):
        raise SnsError(f"{what} is not on an Amazon SNS host")
    if pem and (not parts.path.endswith(".pem") or parts.query or parts.fragment):
        raise SnsError(f"{what} must be a .pem file")
    return url


def string_to_sign(body: dict) -> bytes:
    fields = FIELDS[body["Type"]]
    return "".join(
        f"{name}\n{body[name]}\n" for name in fields if not (name in OPTIONAL and body.get(name) is None)
    ).encode()


def _parse_timestamp(value: str) -> float:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise SnsError("Timestamp is not an ISO 8601 time") from None
    # SNS writes UTC with a Z; a time without a zone is read as UTC, never as this host's local time.
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


# -- certificates -----------------------------------------------------------------------------
transport: httpx.BaseTransport | None = None  # tests: a transport to a local server


def _get(url: str, limit: int) -> bytes:
    """GET `url` (already checked), at most `limit` bytes of body; SnsError on any failure."""
    try:
        with (
            httpx.Client(transport=transport, timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                raise SnsError(f"{urlsplit(url).hostname} answered {response.status_code}")
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise SnsError("answer too large")
            return body
    except httpx.HTTPError as exc:
        raise SnsError(f"could not reach {urlsplit(url).hostname}: {exc.__class__.__name__}") from None


@dataclass(frozen=True)
class Keys:
    """The RSA keys of the certificates valid now, and when the first of them expires."""

    keys: list[rsa.RSAPublicKey]
    expires: datetime

    @property
    def valid(self) -> bool:
        return datetime.now(UTC) < self.expires


def _public_keys(pem: bytes, what: str) -> Keys:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise SnsError(f"{what} is not a PEM certificate") from None
    now = datetime.now(UTC)
    valid = [
        c
        for c in certs
        if isinstance(c.public_key(), rsa.RSAPublicKey) and c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]
    if not valid:
        raise SnsError(f"{what} holds no RSA certificate valid now")
    keys = [c.public_key() for c in valid]
    return Keys([k for k in keys if isinstance(k, rsa.RSAPublicKey)], min(c.not_valid_after_utc for c in valid))


class Certificates:
    """Signing keys by certificate URL: the pinned file's for every URL, or each URL's fetched once."""

    def __init__(self, pinned_file: str = ""):
        self.pinned: Keys | None = None
        if pinned_file:
            try:
                with open(pinned_file, "rb") as f:
                    self.pinned = _public_keys(f.read(), "SNS_SIGNING_CERT_FILE")
            except OSError as exc:
                raise SnsError(f"SNS_SIGNING_CERT_FILE cannot be read: {exc.strerror}") from None
        self._cache: OrderedDict[str, Keys] = OrderedDict()
        self._lock = threading.Lock()  # one fetch at a time: the first request fetches, the rest wait
        self._failed = NegativeCache(1000, FAILED_URL_SECONDS)
        self.fetches = 0

    def at_hand(self, url) -> bool:
        """Whether `keys(url)` answers without fetching (pinned, or fetched before and still valid)."""
        if self.pinned is not None:
            return True
        cached = self._cache.get(url) if isinstance(url, str) else None
        return cached is not None and cached.valid

    def keys(self, url: str) -> list[rsa.RSAPublicKey]:
        if self.pinned is not None:
            if not self.pinned.valid:
                raise SnsError("the certificate of SNS_SIGNING_CERT_FILE has expired")
            return self.pinned.keys
        cached = self._cache.get(url)
        if cached is not None and cached.valid:
            return cached.keys
        if url in self._failed:
            raise SnsError("SigningCertURL failed a moment ago")
        with self._lock:
            cached = self._cache.get(url)
            if cached is None or not cached.valid:  # an expired one is fetched again: AWS may have renewed it
                self.fetches += 1
                try:
                    cached = _public_keys(_get(url, MAX_CERT_BYTES), "SigningCertURL")
                except SnsError:
                    self._failed.add(url)
                    raise
                self._cache[url] = cached
                while len(self._cache) > MAX_CACHED_CERTS:
                    self._cache.popitem(last=False)
            return cached.keys


_certificates: dict[str, Certificates] = {}


def certificates(pinned_file: str) -> Certificates:
    """The process's certificate store for this setting (a settings change in tests gets a new one)."""
    store = _certificates.get(pinned_file)
    if store is None:
        store = _certificates.setdefault(pinned_file, Certificates(pinned_file))
    return store


# -- verification -----------------------------------------------------------------------------
def verify(
    body: object,
    topics: tuple[str, ...],
    store: Certificates,
    max_age_seconds: int,
    now: float | None = None,
) -> Message:
    """The message, if authentic, fresh and from an allowed topic; SnsError otherwise. Fetches the
    signing certificate the first time a URL is seen (blocking: call it off the event loop)."""
    if not isinstance(body, dict):
        raise SnsError("body is not an SNS message")
    kind = body.get("Type")
    if not isinstance(kind, str) or kind not in FIELDS:
        raise SnsError("Type is not an SNS message type")
    for name in FIELDS[kind]:
        value = body.get(name)
        if not isinstance(value, str) and not (name in OPTIONAL and value is None):
            raise SnsError(f"{name} is missing")
    if body["TopicArn"] not in topics:
        raise SnsError("TopicArn is not in SES_SNS_TOPIC_ARNS")
    version = body.get("SignatureVersion")
    if not isinstance(version, str) or version not in HASHES:
        raise SnsError("SignatureVersion must be 1 or 2")
    url = body.get("SigningCertURL")
    if not isinstance(url, str):
        raise SnsError("SigningCertURL is missing")
    check_sns_url(url, "SigningCertURL", pem=True)
    if kind == "SubscriptionConfirmation":
        check_sns_url(body["SubscribeURL"], "SubscribeURL", pem=False)
    sent = _parse_timestamp(body["Timestamp"])
    age = (time.time() if now is None else now) - sent
    if age > max_age_seconds or age < -MAX_FUTURE_SECONDS:
        raise SnsError("Timestamp outside the accepted window")
    signature = body.get("Signature")
    try:
        if not isinstance(signature, str) or len(signature) > MAX_SIGNATURE_CHARS:
            raise ValueError
        raw_signature = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise SnsError("Signature is not base64") from None
    signed = string_to_sign(body)
    for key in store.keys(url):
        try:
            key.verify(raw_signature, signed, padding.PKCS1v15(), HASHES[version]())
        except InvalidSignature:
            continue
        return Message(
            kind, body["MessageId"], body["TopicArn"], body["Message"], body["Timestamp"], body.get("SubscribeURL")
        )
    raise SnsError("signature does not match")


def confirm_subscription(message: Message) -> None:
    """GET the SubscribeURL of a verified SubscriptionConfirmation (its host checked again here,
    whoever calls this); SnsError if SNS does not answer 200."""
    if message.type != "SubscriptionConfirmation" or not message.subscribe_url:
        raise SnsError("not a subscription confirmation")
    _get(check_sns_url(message.subscribe_url, "SubscribeURL", pem=False), MAX_CERT_BYTES)
