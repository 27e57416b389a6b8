"""Providers: registry, file provider, SMTP against a real local server (plain, STARTTLS, SMTPS)."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ssl
import time

import pytest
from aiosmtpd.smtp import AuthResult
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from app.platform import config, mail, providers
from app.platform.providers.base import OutgoingMail, PermanentError, TransientError
from app.platform.providers.file import FileProvider
from app.platform.providers.smtp import SMTPProvider, parse_url
from tests.digest_support import SmtpSink, free_port

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)


def _mails(n, prefix="k"):
    return [
        OutgoingMail(
            to=f"user{i}@example.test",
            subject=f"s{i}",
            html=f"<p>{i}</p>",
            text=str(i),
            idempotency_key=f"{prefix}-{i}",
            headers=mail.unsubscribe_headers("https://x.test/u/T"),
        )
        for i in range(n)
    ]


@pytest.fixture(params=[True, False], ids=["pipelining", "plain-smtp"])
def sink(request):
    s = SmtpSink(pipelining=request.param).start()
    yield s
    s.stop()


@pytest.fixture(params=[True, False], ids=["async", "threads"])
def use_async(request):
    return request.param


@pytest.fixture(autouse=True)
def _close_providers():
    yield
    providers.close_all()


def test_registry_picks_by_mail_provider(settings, tmp_path):
    settings(mail_provider="file", mail_file_dir=str(tmp_path))
    p = providers.get_provider()
    assert isinstance(p, FileProvider) and providers.get_provider() is p
    settings(mail_provider="smtp", smtp_url="smtp://127.0.0.1:2525")
    assert isinstance(providers.get_provider(), SMTPProvider)
    assert isinstance(providers.get_provider("file"), FileProvider)
    with pytest.raises(config.ConfigError):
        providers.get_provider("carrier-pigeon")


def test_sendgrid_is_loaded_lazily_by_name():
    sendgrid = pytest.importorskip("app.platform.providers.sendgrid")
    assert providers.provider_class("sendgrid") is sendgrid.SendGridProvider


def test_parse_url():
    assert parse_url("smtp://u%40x:p%3Aw@mail.test:587?starttls=1") == {
        "host": "mail.test",
        "port": 587,
        "ssl": False,
        "starttls": True,
        "insecure": False,
        "username": "u@x",
        "password": "p:w",
    }
    assert parse_url("smtps://mail.test")["port"] == 465 and parse_url("smtps://mail.test")["ssl"]
    assert parse_url("smtp://mail.test")["port"] == 25
    with pytest.raises(config.ConfigError):
        parse_url("http://mail.test")


def test_file_provider_writes_one_eml_per_key(tmp_path):
    p = FileProvider(str(tmp_path))
    results = p.send_batch(_mails(3) + _mails(1))  # the last one re-sends key k-0
    assert all(r.ok for r in results)
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files == ["k-0.eml", "k-1.eml", "k-2.eml"]
    msg = email.message_from_bytes((tmp_path / "k-1.eml").read_bytes(), policy=email.policy.default)
    assert msg["To"] == "user1@example.test" and results[1].message_id == msg["Message-ID"].strip("<>")


def test_smtp_batch_reuses_a_small_pool_of_connections(sink, use_async):
    p = SMTPProvider(sink.url, pool_size=3, use_async=use_async)
    for batch in range(3):
        results = p.send_batch(_mails(10, prefix=f"b{batch}"))
        assert all(r.ok for r in results) and results[4].message_id.startswith("b" + str(batch) + "-4.")
    assert len(sink.raw) == 30
    assert 1 <= len(sink.sessions) <= 3  # 30 mails, at most 3 connections ever opened
    p.close()


# The pool sizer judges a relay far by its round trips less its event loop's lateness: other tests'
# CPU makes the loop late and hides a far relay.
FAR_RELAY_JUDGED = "the pool sizer's far-relay judgement: other tests' CPU hides a far relay"


@pytest.mark.alone(FAR_RELAY_JUDGED)
def test_async_pool_grows_for_a_slow_relay_within_its_max(settings):
    """A relay with a 50 ms round trip gets more connections than SMTP_POOL_SIZE (they raise the
    throughput), never more than SMTP_POOL_MAX. (A fast one keeps the floor: tests/platform/test_smtp_pool.py.)"""
    settings(smtp_pool_size=2, smtp_pool_max=6)
    slow = SmtpSink().start()
    slow.delay = 0.05
    p = SMTPProvider(slow.url, use_async=True)
    try:
        assert all(r.ok for r in p.send_batch(_mails(12, prefix="warm")))  # measures the round trip
        assert all(r.ok for r in p.send_batch(_mails(60, prefix="big")))
        assert 2 < len(slow.sessions) <= 6
        assert p._async.lanes_for(1000) == 6 and p._async.lanes_for(1) == 1
    finally:
        p.close()
        slow.stop()


def test_smtp_reply_codes_map_to_transient_and_permanent(sink, use_async):
    p = SMTPProvider(sink.url, pool_size=1, use_async=use_async)
    sink.reply = "452 4.2.2 mailbox full"
    (r,) = p.send_batch(_mails(1))
    assert not r.ok and not r.permanent and "452" in r.error
    sink.reply = "550 5.1.1 unknown user"
    (r,) = p.send_batch(_mails(1))
    assert not r.ok and r.permanent and "550" in r.error
    sink.reply = "250 OK"
    assert p.send_batch(_mails(1))[0].ok  # the connection survived the refusals
    p.close()


def test_bad_recipient_fails_alone_in_its_batch(sink, use_async):
    p = SMTPProvider(sink.url, pool_size=2, use_async=use_async)
    mails = _mails(4)
    mails[1].to = "broken\r\nBcc: x@y.z"
    sink.reject_rcpt.add("user2@example.test")
    results = p.send_batch(mails)
    assert [r.ok for r in results] == [True, False, False, True]
    assert results[1].permanent and results[2].permanent and "550" in results[2].error
    assert len(sink.raw) == 2
    p.close()


def test_a_lane_sends_its_next_envelope_with_the_data_and_refusals_keep_it_in_step(sink, use_async, settings):
    """With PIPELINING the async lane writes mail k+1's envelope with mail k's data: a mail refused
    at its data or its recipient, in the middle of one connection's run, fails alone, and every
    other mail is delivered once, to its own recipient, on that one connection."""
    settings(smtp_pool_size=1, smtp_pool_max=1)
    p = SMTPProvider(sink.url, use_async=use_async)
    mails = _mails(10)
    sink.reject_data["user3@example.test"] = "554 5.7.1 refused"
    sink.reject_rcpt.add("user6@example.test")
    results = p.send_batch(mails)
    assert [r.ok for r in results] == [i not in (3, 6) for i in range(10)]
    assert results[3].permanent and "554" in results[3].error
    assert results[6].permanent and "550" in results[6].error
    delivered = [rcpts for _, rcpts in sink.envelopes]
    assert delivered == [[f"user{i}@example.test"] for i in range(10) if i not in (3, 6)]
    for raw, i in zip(sink.raw, [i for i in range(10) if i not in (3, 6)], strict=True):
        assert email.message_from_bytes(raw, policy=email.policy.default)["Subject"] == f"s{i}"
    assert len(sink.sessions) == 1
    assert all(r.ok for r in p.send_batch(_mails(3, prefix="again")))  # the connection came back clean
    assert len(sink.sessions) == 1
    p.close()


def test_a_stop_holds_back_the_mail_whose_envelope_went_out_with_the_last_data(settings):
    """The next mail's envelope and DATA travel with this mail's data; a stop that comes before this
    mail is answered still holds the next one back: the lane closes the connection (what aborts a
    transaction after DATA) instead of sending its content. Nothing is handed over once stopped."""
    import threading

    from app.platform.providers.base import Progress

    settings(smtp_pool_size=1, smtp_pool_max=1)
    sink = SmtpSink(pipelining=True).start()
    sink.hold_after = 0  # the first mail is taken and left unanswered until release()
    stop = threading.Event()
    progress = Progress(lambda new: stop.is_set(), every=1, interval=0.01)
    p = SMTPProvider(sink.url, use_async=True)

    def stop_while_the_first_waits():
        deadline = time.monotonic() + 10
        while not sink.raw and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        time.sleep(0.3)  # the batch's thread polls its progress meanwhile: the stop is requested
        sink.release()

    helper = threading.Thread(target=stop_while_the_first_waits)
    helper.start()
    try:
        results = p.send_batch(_mails(3), progress)
    finally:
        helper.join()
        p.close()
        sink.stop()
    assert results[0].ok and all(r.stopped for r in results[1:]), results
    assert [rcpts for _, rcpts in sink.envelopes] == [["user0@example.test"]]


def test_dot_stuffing_keeps_lines_that_start_with_a_dot(sink, use_async):
    p = SMTPProvider(sink.url, pool_size=1, use_async=use_async)
    m = _mails(1)[0]
    m.text = ".\n..two\n.three"
    assert p.send_batch([m])[0].ok
    msg = email.message_from_bytes(sink.raw[0], policy=email.policy.default)
    assert msg.get_body(("plain",)).get_content().replace("\r\n", "\n") == ".\n..two\n.three"
    p.close()


@pytest.mark.alone(FAR_RELAY_JUDGED)
def test_first_batch_to_a_slow_relay_probes_its_round_trip_before_choosing_lanes(settings):
    """A fresh pool does not know the relay's round trip: one mail goes alone first, then the rest
    of the same batch gets the lanes that round trip asks for (not SMTP_POOL_SIZE in turns)."""
    settings(smtp_pool_size=2, smtp_pool_max=6)
    slow = SmtpSink().start()
    slow.delay = 0.05
    p = SMTPProvider(slow.url, use_async=True)
    try:
        assert all(r.ok for r in p.send_batch(_mails(30, prefix="first")))
        assert len(slow.raw) == 30 and len(slow.sessions) == 6
        assert 0.04 < p._async.latency < 0.5
    finally:
        p.close()
        slow.stop()


def test_lanes_follow_the_measured_latency():
    p = SMTPProvider("smtp://127.0.0.1:25", pool_size=40, use_async=False)
    p._latency = 0.0002  # a fast local relay: one connection is plenty
    assert p.lanes_for(50) == 1
    p._latency = 0.05  # a 50 ms ESP round trip: spread over many connections
    assert p.lanes_for(50) == 40 and p.lanes_for(10) == 10


def test_smtp_unreachable_is_transient(use_async):
    p = SMTPProvider(f"smtp://127.0.0.1:{free_port()}", pool_size=2, use_async=use_async)
    with pytest.raises(TransientError):
        p.send_batch(_mails(3))


def test_smtp_reconnects_when_the_server_dropped_an_idle_connection(sink, use_async):
    p = SMTPProvider(sink.url, pool_size=1, use_async=use_async)
    assert p.send_batch(_mails(1))[0].ok
    sink.stop()  # the server goes away, killing pooled sockets
    again = SmtpSink(port=sink.port).start()  # and comes back on the same port
    try:
        assert all(r.ok for r in p.send_batch(_mails(2, prefix="again")))
        assert len(again.raw) == 2
    finally:
        p.close()
        again.stop()
        sink.controller = SmtpSink(port=free_port()).controller  # the fixture stops something running
        sink.controller.start()


def _self_signed(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return ctx


def test_starttls_and_login(tmp_path, use_async):
    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == b"user" and auth_data.password == b"secret"
        return AuthResult(success=ok, handled=False)

    s = SmtpSink(
        tls_context=_self_signed(tmp_path),
        require_starttls=True,
        authenticator=authenticator,
        auth_required=True,
        auth_exclude_mechanism=["LOGIN"],
    ).start()
    try:
        p = SMTPProvider(
            f"smtp://user:secret@127.0.0.1:{s.port}?starttls=1&insecure=1", pool_size=1, timeout=5, use_async=use_async
        )
        assert p.send_batch(_mails(2))[1].ok and len(s.raw) == 2
        p.close()
        wrong = SMTPProvider(
            f"smtp://user:nope@127.0.0.1:{s.port}?starttls=1&insecure=1", pool_size=1, timeout=5, use_async=use_async
        )
        with pytest.raises(PermanentError):
            wrong.send_batch(_mails(1))
        plain = SMTPProvider(f"smtp://user:secret@127.0.0.1:{s.port}", pool_size=1, timeout=5, use_async=use_async)
        with pytest.raises(PermanentError, match="starttls"):
            plain.send_batch(_mails(1))  # AUTH is only offered after STARTTLS
    finally:
        s.stop()


def test_implicit_tls_smtps(tmp_path, use_async):
    s = SmtpSink(ssl_context=_self_signed(tmp_path)).start()
    try:
        p = SMTPProvider(f"smtps://127.0.0.1:{s.port}?insecure=1", pool_size=1, use_async=use_async)
        assert p.send_batch(_mails(1))[0].ok and len(s.raw) == 1
        p.close()
    finally:
        s.stop()


@pytest.mark.parametrize("smtputf8", [True, False])
def test_non_ascii_recipient_needs_smtputf8_and_never_fails_the_batch(use_async, smtputf8):
    s = SmtpSink(enable_SMTPUTF8=smtputf8).start()
    try:
        p = SMTPProvider(s.url, pool_size=1, use_async=use_async)
        mails = _mails(2)
        mails[0].to = "jürgen@exämple.test"
        results = p.send_batch(mails)
        assert results[1].ok
        if smtputf8:
            assert results[0].ok and ["jürgen@exämple.test"] in [rcpts for _, rcpts in s.envelopes]
        else:
            assert not results[0].ok and results[0].permanent and "SMTPUTF8" in results[0].error
            assert len(s.raw) == 1
        p.close()
    finally:
        s.stop()
