"""Dev mail viewer (scripts/dev/mailviewer.py, its own process): the aiosmtpd sink stores mail,
/dev/mail lists it and renders it sandboxed."""

from __future__ import annotations

import pytest
from aiosmtpd.controller import Controller
from starlette.testclient import TestClient

from app.platform import mail
from app.platform.providers.base import OutgoingMail
from app.platform.providers.smtp import SMTPProvider
from scripts.dev import mailviewer
from tests.digest_support import free_port


@pytest.fixture
def client():
    with TestClient(mailviewer.viewer_app()) as c:
        yield c


def test_sink_catches_mail_and_the_viewer_shows_it(tmp_path, settings, client):
    settings(mail_file_dir=str(tmp_path))
    port = free_port()
    controller = Controller(mailviewer.SinkHandler(tmp_path), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        provider = SMTPProvider(f"smtp://127.0.0.1:{port}", pool_size=1)
        m = OutgoingMail(
            to="ana@example.test",
            subject="Your daily digest <3",
            html="<p>Hi <b>Ana</b></p><script>x()</script>",
            text="Hi Ana",
            idempotency_key="digest-run-7",
            headers=mail.unsubscribe_headers("https://x.test/u/T"),
        )
        assert provider.send_batch([m])[0].ok
        provider.close()
    finally:
        controller.stop()
    (stored,) = list(tmp_path.glob("*.eml"))
    page = client.get("/dev/mail")
    assert page.status_code == 200 and "Your daily digest &lt;3" in page.text and stored.stem in page.text
    detail = client.get(f"/dev/mail/{stored.stem}")
    assert (
        "sandbox='allow-same-origin'" in detail.text
        and "allow-scripts" not in detail.text
        and "List-Unsubscribe" in detail.text
        and "Hi Ana" in detail.text
    )
    body = client.get(f"/dev/mail/{stored.stem}/html")
    assert body.headers["content-security-policy"] == "sandbox allow-same-origin" and "<b>Ana</b>" in body.text
    assert client.get(f"/dev/mail/{stored.stem}/raw").text.startswith("From:")
    assert client.get("/dev/mail/..%2F..%2Fetc%2Fpasswd/html").status_code == 404
    assert client.get("/dev/mail/nope/html").status_code == 404


def test_viewer_is_development_only(settings, client):
    settings(env="production")
    assert client.get("/dev/mail").status_code == 404


def test_mail_sink_arguments():
    args = mailviewer.parse_args(["--port", "2599"])
    assert args.port == 2599 and args.host == "127.0.0.1" and args.web_port == 8025


def test_the_sink_refuses_to_run_outside_development(settings):
    settings(env="production")
    assert mailviewer.main(["--port", str(free_port()), "--web-port", str(free_port())]) == 2
