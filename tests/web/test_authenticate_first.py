"""Authenticate before working (issue 25, item 8): the SendGrid webhook looks at its signature headers
before reading a byte of the body, and the /admin sign-in counts an attempt before checking its key,
so parallel attempts cannot slip past the limit. A real uvicorn, raw sockets, real Postgres/Redis.

Neither test depends on timing: the webhook's answer arrives while the client has sent no body at
all, and the sign-in test holds every key lookup on a Postgres lock and counts who is waiting."""

from __future__ import annotations

import base64
import collections
import re
import secrets
import socket
import threading
import time

import httpx
import psycopg2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.web.admin import views
from tests.conftest import wait_for
from tests.raw_http import closed_by_server, connect
from tracking import signature

EIGHT_MIB = 8 * 1024 * 1024


@pytest.fixture
def signing_key(settings):
    """The webhook verifies with this key's public half (SENDGRID_WEBHOOK_PUBLIC_KEY)."""
    private = ec.generate_private_key(ec.SECP256R1())
    public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    settings(sendgrid_webhook_public_key=base64.b64encode(public).decode())
    return private


def headers_only(sock: socket.socket, extra: bytes) -> bytes:
    """Send a webhook request's headers declaring an 8 MiB body, none of it; the answer."""
    sock.sendall(
        b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % EIGHT_MIB + extra + b"\r\n"
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer: {answer!r}"
        answer += chunk
    return answer


SIG = b"X-Twilio-Email-Event-Webhook-Signature: "
TS = b"X-Twilio-Email-Event-Webhook-Timestamp: "
NOW = b"{now}"  # replaced by the current unix time when the request is sent


@pytest.mark.parametrize(
    "extra",
    [
        b"",
        TS + NOW + b"\r\n",
        SIG + b"MEUCIQ==\r\n",
        SIG + b"not base64!\r\n" + TS + NOW + b"\r\n",
        SIG + base64.b64encode(b"not DER") + b"\r\n" + TS + NOW + b"\r\n",
        SIG + b"A" * 4000 + b"\r\n" + TS + NOW + b"\r\n",
        SIG + b"MAYCAQECAQE=\r\n" + TS + b"1000\r\n",
        SIG + b"MAYCAQECAQE=\r\n" + TS + b"\xb2\r\n",
    ],
    ids=["none", "no-signature", "no-timestamp", "not-base64", "not-der", "too-long", "stale", "odd-digit"],
)
def test_an_unsigned_webhook_is_refused_before_its_body_is_read(live_server, signing_key, extra):
    with connect(live_server) as sock:
        answer = headers_only(sock, extra.replace(NOW, str(int(time.time())).encode()))  # no byte of the 8 MiB
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
        assert b"connection: close" in answer.lower()
        assert closed_by_server(sock)  # nothing more is read from this client


def test_headers_that_pass_still_need_the_body_that_was_signed(live_server, signing_key):
    body = b'[{"email":"a@example.com","event":"delivered","sg_event_id":"e1","timestamp":1700000000}]'
    ts = str(int(time.time())).encode()
    good = base64.b64encode(signing_key.sign(ts + body, ec.ECDSA(hashes.SHA256())))
    for sent, status in ((body, b"200"), (body.replace(b"delivered", b"bounce"), b"403")):
        with connect(live_server) as sock:
            sock.sendall(
                b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(sent)
                + b"X-Twilio-Email-Event-Webhook-Signature: "
                + good
                + b"\r\n"
                + b"X-Twilio-Email-Event-Webhook-Timestamp: "
                + ts
                + b"\r\nConnection: close\r\n\r\n"
                + sent
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]


def test_the_header_checks_alone_name_what_is_wrong():
    now = 1_700_000_000
    ok = signature.check_headers("MAYCAQECAQE=", str(now), 600, now=now)
    assert ok.timestamp == str(now) and ok.signature == bytes.fromhex("3006020101020101")
    for sig, ts, message in [
        (None, str(now), "missing"),
        ("MAYCAQECAQE=", "\u00b2", "not a unix time"),
        ("MAYCAQECAQE=", str(now - 601), "window"),
        ("MAYCAQE", str(now), "not base64"),
        ("bm90IERFUg==", str(now), "not a DER ECDSA signature"),
    ]:
        with pytest.raises(signature.SignatureError, match=message):
            signature.check_headers(sig, ts, 600, now=now)


# ---------------------------------------------------------------- the sign-in throttle

LIMIT = 3
ATTEMPTS = 8


@pytest.fixture
def key_lookups_held(database_url):
    """Every API key lookup waits on a lock this test holds; `waiting()` counts the lookups waiting,
    from a second connection (pg_stat_activity is a snapshot per transaction). Neither connection
    is the app's."""
    holder, watcher = psycopg2.connect(database_url), psycopg2.connect(database_url)
    watcher.autocommit = True
    holder.cursor().execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")

    def waiting() -> int:
        with watcher.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
                " AND datname = current_database()",
                ("%FROM api_keys WHERE key_hash%",),
            )
            return cur.fetchone()[0]

    def release() -> None:
        if not holder.closed:
            holder.rollback()
            holder.close()

    yield waiting, release
    release()
    watcher.close()


def test_parallel_sign_ins_past_the_limit_are_refused_without_checking_their_keys(
    live_server, settings, redis_client, monkeypatch, key_lookups_held
):
    waiting, release = key_lookups_held
    settings(admin_login_max_failures=LIMIT)
    monkeypatch.setattr(views, "FAILED_LOGIN_DELAY_SECONDS", 0)
    form = httpx.get(f"{live_server}/admin/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
    statuses: list[int] = []

    def attempt() -> None:
        r = httpx.post(
            f"{live_server}/admin/login",
            cookies=form.cookies,
            timeout=60,
            data={"csrf_token": token, "api_key": "nk_" + secrets.token_urlsafe(32)},
        )
        statuses.append(r.status_code)

    threads = [threading.Thread(target=attempt) for _ in range(ATTEMPTS)]
    try:
        for t in threads:
            t.start()
        # Every attempt either answered or is checking its key (waiting on the lock): count both.
        wait_for(lambda: len(statuses) + waiting() == ATTEMPTS, 60, "every attempt to answer or wait")
        assert waiting() == LIMIT and statuses == [429] * (ATTEMPTS - LIMIT), (waiting(), statuses)
    finally:
        release()
        for t in threads:
            t.join(60)
    assert collections.Counter(statuses) == {401: LIMIT, 429: ATTEMPTS - LIMIT}
