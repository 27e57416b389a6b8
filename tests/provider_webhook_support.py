"""What the SES, Postmark and Mailgun webhook tests share: an SNS signing certificate the test makes,
SNS messages signed with it (v1 SHA1, v2 SHA256) by the string AWS documents, a local HTTP server that
records what it is asked, and the stored events applied as the worker applies them."""

from __future__ import annotations

import base64
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from app.platform import db
from app.platform.addresses import canonical
from app.subscribers import suppressions
from tracking import webhook_apply

TOPIC = "arn:aws:sns:eu-west-1:123456789012:ses-events"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem"
SUBSCRIBE_URL = (
    "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=" + TOPIC + "&Token=2336412f37fb687f5d51"
)
CANONICAL = "ana@xn--bcher-kva.example"
# How the subscriber gave it, and how a provider reports it (README "Address identity").
SPELLINGS = ["Ana@Bücher.example", "ANA@XN--BCHER-KVA.EXAMPLE", "ａｎａ@bücher.example", "ANA@BÜCHER.EXAMPLE"]


class SigningKey:
    """An RSA key and a self-signed certificate for it, valid now (or expired yesterday), as PEM."""

    def __init__(self, common_name: str = "sns.amazonaws.com", expired: bool = False):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=60))
            .not_valid_after(now + timedelta(days=-1 if expired else 30))
            .sign(self.key, hashes.SHA256())
        )
        self.pem = cert.public_bytes(serialization.Encoding.PEM)


def string_to_sign(message: dict) -> bytes:
    """AWS's string to sign, written out here as its documentation gives it (not the code under test)."""
    if message["Type"] == "Notification":
        names = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    else:
        names = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    return "".join(f"{n}\n{message[n]}\n" for n in names if n in message).encode()


def sign(key: SigningKey, message: dict, version: str = "1") -> dict:
    message = {**message, "SignatureVersion": version}
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = key.key.sign(string_to_sign(message), padding.PKCS1v15(), digest)
    return {**message, "Signature": base64.b64encode(signature).decode()}


def sns_time(seconds_ago: float = 0) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def notification(ses_event: dict, message_id: str = "9f3a1c2e-0000-4000-8000-000000000001", **fields) -> dict:
    """An SNS Notification carrying `ses_event`, unsigned."""
    return {
        "Type": "Notification",
        "MessageId": message_id,
        "TopicArn": TOPIC,
        "Message": orjson.dumps(ses_event).decode(),
        "Timestamp": sns_time(),
        "SigningCertURL": CERT_URL,
        "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=" + TOPIC + ":x",
        **fields,
    }


def subscription_confirmation(**fields) -> dict:
    return {
        "Type": "SubscriptionConfirmation",
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37fb687f5d51",
        "TopicArn": TOPIC,
        "Message": f"You have chosen to subscribe to the topic {TOPIC}.",
        "SubscribeURL": SUBSCRIBE_URL,
        "Timestamp": sns_time(),
        "SigningCertURL": CERT_URL,
        **fields,
    }


def ses_event(kind: str, recipients: list[str], message_id: str = "0100018c-ses-message-id", **detail) -> dict:
    """An SES configuration-set event (`eventType`) of this kind naming these recipients."""
    mail = {
        "timestamp": sns_time(),
        "source": "notify@example.com",
        "messageId": message_id,
        "destination": recipients,
    }
    body: dict = {"eventType": kind, "mail": mail}
    if kind == "Bounce":
        body["bounce"] = {
            "bounceType": "Permanent",
            "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": r, "action": "failed", "status": "5.1.1"} for r in recipients],
            "feedbackId": "feedback-1",
            **detail,
        }
    elif kind == "Complaint":
        body["complaint"] = {
            "complainedRecipients": [{"emailAddress": r} for r in recipients],
            "complaintFeedbackType": "abuse",
            **detail,
        }
    elif kind == "Delivery":
        body["delivery"] = {"recipients": recipients, "smtpResponse": "250 ok", **detail}
    elif kind == "Open":
        body["open"] = {"ipAddress": "192.0.2.1", "userAgent": "Mail", **detail}
    return body


class Recorder(BaseHTTPRequestHandler):
    """Answers GETs from the server's `files` (path -> bytes), 404 otherwise; records every request."""

    def do_GET(self):
        self.server.requests.append((self.path, self.headers.get("Host")))  # type: ignore[attr-defined]
        body = self.server.files.get(self.path.split("?")[0])  # type: ignore[attr-defined]
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


class LocalServer:
    """A real HTTP server on 127.0.0.1 in a thread."""

    def __init__(self, files: dict[str, bytes] | None = None):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        self.httpd.files = files or {}  # type: ignore[attr-defined]
        self.httpd.requests = []  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def requests(self) -> list[tuple[str, str]]:
        return self.httpd.requests  # type: ignore[attr-defined]

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class ToLocal(httpx.HTTPTransport):
    """Carries a request for an (already checked) SNS URL to the local server, over plain HTTP: the
    SNS host goes along in the Host header, as the server would have received it."""

    def __init__(self, server: LocalServer):
        super().__init__()
        self.server = server

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=self.server.port)
        return super().handle_request(request)


def stored() -> list[tuple]:
    return db.query("SELECT sg_event_id, event, email FROM webhook_events ORDER BY sg_event_id")


def event_count() -> int:
    return db.query("SELECT count(*) FROM webhook_events")[0][0]


def apply_all() -> int:
    """Every stored event applied, as the worker applies them."""
    return webhook_apply.apply_events([r[0] for r in db.query("SELECT id FROM webhook_events")])


def suppressed_under_every_spelling(reason: str) -> bool:
    """The one suppression row, canonical, found by each spelling of the address."""
    assert db.query("SELECT email, reason FROM suppressions") == [(CANONICAL, reason)]
    with db.raw_cursor() as cur:
        return all(
            (found := suppressions.find(cur, canonical(s))) is not None and found.reason == reason for s in SPELLINGS
        )


def mail_counts() -> dict:
    return {(k, i, e): n for k, i, e, n in db.query("SELECT mail_kind, mail_id, event, count FROM mail_event_counts")}
