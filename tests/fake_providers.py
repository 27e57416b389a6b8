"""Real local HTTP servers that speak enough of Amazon SES v2, Postmark and Mailgun for tests.

Each listens on 127.0.0.1 (ephemeral port), checks its credentials the way the real API does
(SES: the SigV4 signature recomputed with botocore from the signed headers; Postmark: the server
token; Mailgun: basic auth), parses every mail it accepts and records it under OUR Message-ID (the
one mail.py derives from the idempotency key): `accepted` counts every acceptance, so a test sees a
mail accepted twice, and `delivered` holds each mail once as its recipient would read it.

Knobs, one per call, in order: `fail_next(n, status)` (answered with that status, nothing
accepted), `hang_next(n, seconds)` (accepted, then the answer comes `seconds` later: a client that
gave up sooner does not know), `drop_next(n)` (accepted, then the connection is closed with no
answer). `refuse(address)`: that recipient is refused the way the API refuses one (SES 400
MessageRejected, Postmark ErrorCode 406 in the batch answer, Mailgun 400). `fail_for(seconds,
status)`: an outage, every call answered with that status until it ends (the failover drill,
scripts/drill.py). `delay`: seconds every call takes, like a provider's round trip.

`answers` logs every call answered, (time.monotonic() of the answer, status, mails accepted) — the
fake's own clock: when the first 503 went out, when mail was first accepted after it.
`record=False` keeps only each mail's recipient (benchmarks: no bodies held).

`python -m tests.fake_providers ses|postmark|mailgun [--delay S]` runs one on its own for the
benchmarks (scripts/bench/newsletter.py): it prints its base URL, then its counters as one JSON
line for every line read on stdin, and exits at EOF.
"""

from __future__ import annotations

import base64
import collections
import email
import email.policy
import email.utils
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def read_mime(raw: bytes) -> dict:
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    html = msg.get_body(("html",))
    text = msg.get_body(("plain",))
    return {
        "to": str(msg["To"]),
        "from": str(msg["From"]),
        "subject": str(msg["Subject"]),
        "message_id": str(msg["Message-ID"]).strip("<>"),
        "html": html.get_content() if html else "",
        "text": text.get_content() if text else "",
        "headers": {k: str(v) for k, v in msg.items()},
        "raw": raw,
    }


class _Server(ThreadingHTTPServer):
    # A backlog of 5 (socketserver's default) overflows when a worker opens its pool's 64 connections at
    # once: the kernel drops the handshake's last ACK, the client writes its request, and the
    # connection is reset — an ambiguous outcome no real provider API would cause.
    request_queue_size = 1024


class FakeAPI:
    name = "fake"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, delay: float = 0.0, record: bool = True):
        self.delay, self.record = delay, record
        self.lock = threading.Lock()
        self.answers: list[tuple[float, int, int]] = []  # (monotonic time, status, mails accepted)
        self._outage: tuple[float, int] = (0.0, 503)  # (until, status): fail_for()
        self.calls = 0
        self.status_counts: collections.Counter = collections.Counter()
        self.accepted: collections.Counter = collections.Counter()  # our Message-ID -> acceptances
        self.delivered: dict[str, dict] = {}  # our Message-ID -> the mail, first acceptance
        self.unauthorized = 0
        self.refused: set[str] = set()
        self._plan: collections.deque = collections.deque()
        self.server = _Server((host, port), self._handler())
        self.server.daemon_threads = True
        self.base_url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-{self.name}", daemon=True
        )

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # -- knobs -----------------------------------------------------------------------------------
    def fail_next(self, n: int, status: int = 503) -> None:
        self._plan.extend([("status", status)] * n)

    def hang_next(self, n: int, seconds: float) -> None:
        self._plan.extend([("hang", seconds)] * n)

    def drop_next(self, n: int) -> None:
        self._plan.extend([("drop", 0)] * n)

    def refuse(self, address: str) -> None:
        self.refused.add(address)

    def fail_for(self, seconds: float, status: int = 503) -> float:
        """Answer every call with `status` for `seconds` from now; returns when that ends (monotonic)."""
        until = time.monotonic() + seconds
        with self.lock:
            self._outage = (until, status)
        return until

    def first_answer(self, status: int | None = None, accepted: bool = False, after: float = 0.0) -> float | None:
        """When the first call after `after` was answered with `status` (or, `accepted`: with mail
        accepted), by this fake's clock; None if none was."""
        with self.lock:
            for at, code, n in self.answers:
                if at >= after and (status is None or code == status) and (not accepted or n > 0):
                    return at
        return None

    def recipients(self) -> collections.Counter:
        """Recipient address -> mails accepted for it (every acceptance counts)."""
        with self.lock:
            out: collections.Counter = collections.Counter()
            for mid, n in self.accepted.items():
                out[email.utils.parseaddr(self.delivered[mid]["to"])[1]] += n
            return out

    # -- what each API does ----------------------------------------------------------------------
    def authorized(self, method: str, path: str, headers, body: bytes) -> bool:
        raise NotImplementedError

    def mails(self, path: str, headers, body: bytes) -> list[dict]:
        """The mails of a request, each {to, subject, html, text, headers, message_id, ...}."""
        raise NotImplementedError

    def answer(self, mails: list[dict], accepted: list[bool]) -> tuple[int, Any, dict]:
        """(status, JSON body, headers) for a request whose mails were accepted as `accepted` says."""
        raise NotImplementedError

    def refusal(self, mail: dict) -> bool:
        return email.utils.parseaddr(mail["to"])[1] in self.refused

    def _accept(self, mails: list[dict]) -> list[bool]:
        accepted = []
        with self.lock:
            for m in mails:
                ok = not self.refusal(m)
                if ok:
                    self.accepted[m["message_id"]] += 1
                    self.delivered.setdefault(m["message_id"], m if self.record else {"to": m["to"]})
                accepted.append(ok)
        return accepted

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if fake.delay:
                    time.sleep(fake.delay)
                with fake.lock:
                    fake.calls += 1
                    action = fake._plan.popleft() if fake._plan else ("ok", 0)
                    if action[0] == "ok" and time.monotonic() < fake._outage[0]:
                        action = ("status", fake._outage[1])
                if not fake.authorized("POST", self.path, self.headers, body):
                    with fake.lock:
                        fake.unauthorized += 1
                    return self._answer(401, {"message": "unauthorized"}, {})
                if action[0] == "status":
                    return self._answer(action[1], {"message": f"fake says {action[1]}"}, {})
                mails = fake.mails(self.path, self.headers, body)
                accepted = fake._accept(mails)
                if action[0] == "hang":
                    time.sleep(action[1])
                elif action[0] == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                status, answer, headers = fake.answer(mails, accepted)
                self._answer(status, answer, headers, taken=sum(accepted))

            def _answer(self, status, body, headers, taken: int = 0):
                with fake.lock:
                    fake.status_counts[status] += 1
                    fake.answers.append((time.monotonic(), status, taken if 200 <= status < 300 else 0))
                data = orjson.dumps(body)
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a hang longer than its timeout)
                    self.close_connection = True

        return Handler


class FakeSES(FakeAPI):
    """SES v2 SendEmail (`POST /v2/email/outbound-emails`, Content.Raw)."""

    name = "ses"
    REGION = "eu-west-1"
    KEY, SECRET = "AKIDFAKESES", "fake-ses-secret"
    _AUTH = re.compile(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/ses/aws4_request, "
        r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})"
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.url = self.base_url
        self.requests: list[dict] = []

    def authorized(self, method, path, headers, body) -> bool:
        """Recompute the signature from the headers the client signed (as AWS does)."""
        match = self._AUTH.fullmatch(headers.get("Authorization", ""))
        if not match or path != "/v2/email/outbound-emails":
            return False
        key, day, region, signed, signature = match.groups()
        amz_date = headers.get("X-Amz-Date", "")
        names = signed.split(";")
        if key != self.KEY or region != self.REGION or not amz_date.startswith(day) or "x-amz-date" not in names:
            return False
        request = AWSRequest(
            method=method,
            url=f"http://{headers['Host']}{path}",
            data=body,
            headers={n: headers[n] for n in names if n != "host"},
        )
        request.context["timestamp"] = amz_date
        auth = SigV4Auth(Credentials(self.KEY, self.SECRET, headers.get("X-Amz-Security-Token")), "ses", region)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        return expected == signature

    def mails(self, path, headers, body) -> list[dict]:
        payload = orjson.loads(body)
        with self.lock:
            self.requests.append(payload)
        m = read_mime(base64.b64decode(payload["Content"]["Raw"]["Data"]))
        m["envelope_to"] = payload["Destination"]["ToAddresses"]
        m["tags"] = {t["Name"]: t["Value"] for t in payload.get("EmailTags", [])}
        m["configuration_set"] = payload.get("ConfigurationSetName")
        return [m]

    def answer(self, mails, accepted):
        if not accepted[0]:
            return 400, {"message": "Email address is not verified."}, {"x-amzn-ErrorType": "MessageRejected"}
        return 200, {"MessageId": f"ses-{mails[0]['message_id']}"}, {}


class FakePostmark(FakeAPI):
    """Postmark `POST /email/batch`."""

    name = "postmark"
    TOKEN = "fake-postmark-token"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.url = self.base_url
        self.batches: list[int] = []

    def authorized(self, method, path, headers, body) -> bool:
        return path == "/email/batch" and headers.get("X-Postmark-Server-Token") == self.TOKEN

    def mails(self, path, headers, body) -> list[dict]:
        messages = orjson.loads(body)
        with self.lock:
            self.batches.append(len(messages))
        out = []
        for p in messages:
            headers_ = {h["Name"]: h["Value"] for h in p.get("Headers", [])}
            out.append(
                {
                    "to": p["To"],
                    "from": p["From"],
                    "subject": p["Subject"],
                    "html": p.get("HtmlBody", ""),
                    "text": p.get("TextBody", ""),
                    "headers": headers_,
                    "message_id": headers_["Message-ID"].strip("<>"),
                    "metadata": p.get("Metadata", {}),
                    "stream": p.get("MessageStream"),
                    "tracking": (p.get("TrackOpens"), p.get("TrackLinks")),
                }
            )
        return out

    def answer(self, mails, accepted):
        return (
            200,
            [
                {"ErrorCode": 0, "Message": "OK", "MessageID": f"pm-{m['message_id']}", "To": m["to"]}
                if ok
                else {
                    "ErrorCode": 406,
                    "Message": "You tried to send to recipient(s) that have been marked as inactive.",
                }
                for m, ok in zip(mails, accepted)
            ],
            {},
        )


class FakeMailgun(FakeAPI):
    """Mailgun `POST /v3/{domain}/messages.mime` (multipart form: `to`, `message`)."""

    name = "mailgun"
    KEY, DOMAIN = "fake-mailgun-key", "mg.example.test"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.url = self.base_url
        self.forms: list[dict] = []

    def authorized(self, method, path, headers, body) -> bool:
        expected = "Basic " + base64.b64encode(f"api:{self.KEY}".encode()).decode()
        return path == f"/v3/{self.DOMAIN}/messages.mime" and headers.get("Authorization") == expected

    def mails(self, path, headers, body) -> list[dict]:
        form = email.message_from_bytes(
            f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + body, policy=email.policy.HTTP
        )
        fields: dict[str, Any] = {}
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = part.get_payload(decode=True)
        with self.lock:
            self.forms.append({k: v for k, v in fields.items() if k != "message"})
        m = read_mime(fields["message"])
        m["envelope_to"] = fields["to"].decode()
        m["variables"] = {k[2:]: v.decode() for k, v in fields.items() if k.startswith("v:")}
        m["options"] = {k: v.decode() for k, v in fields.items() if k.startswith("o:")}
        return [m]

    def refusal(self, mail: dict) -> bool:
        return mail["envelope_to"] in self.refused

    def answer(self, mails, accepted):
        if not accepted[0]:
            return 400, {"message": "'to' parameter is not a valid address. please check documentation"}, {}
        return 200, {"id": f"<{mails[0]['message_id']}>", "message": "Queued. Thank you."}, {}


FAKES: dict[str, type[FakeAPI]] = {"ses": FakeSES, "postmark": FakePostmark, "mailgun": FakeMailgun}


def settings_for(fake: FakeAPI) -> dict[str, str]:
    """The settings that point a provider at this fake (environment variable names)."""
    if isinstance(fake, FakeSES):
        return {
            "SES_REGION": FakeSES.REGION,
            "SES_ENDPOINT_URL": fake.url,
            "AWS_ACCESS_KEY_ID": FakeSES.KEY,
            "AWS_SECRET_ACCESS_KEY": FakeSES.SECRET,
        }
    if isinstance(fake, FakePostmark):
        return {"POSTMARK_SERVER_TOKEN": FakePostmark.TOKEN, "POSTMARK_API_URL": fake.url}
    if isinstance(fake, FakeMailgun):
        return {"MAILGUN_API_KEY": FakeMailgun.KEY, "MAILGUN_DOMAIN": FakeMailgun.DOMAIN, "MAILGUN_API_URL": fake.url}
    raise TypeError(fake)


def main() -> None:  # pragma: no cover - `python -m tests.fake_providers ses --delay 0.05` for the benchmark
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("provider", choices=sorted(FAKES))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    fake = FAKES[args.provider](port=args.port, delay=args.delay, record=False)
    with fake:
        print(orjson.dumps(settings_for(fake)).decode(), flush=True)
        for _line in sys.stdin:  # any line: print counters; EOF: exit
            with fake.lock:
                counters = {
                    "calls": fake.calls,
                    "accepted": sum(fake.accepted.values()),
                    "unique": len(fake.accepted),
                    "statuses": {str(k): v for k, v in fake.status_counts.items()},
                }
            print(orjson.dumps(counters).decode(), flush=True)


if __name__ == "__main__":
    main()
