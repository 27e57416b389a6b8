"""View in browser: every digest links to a hosted copy of itself (GET /v/{token}), signed and
bound to token_version like the unsubscribe link, re-rendered from the run's events, no pixel."""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

import pytest

from app.platform import db, tokens
from digest import marks as digest_marks
from digest import send as digest_send
from tests import factories
from tests.digest_support import sink_as_provider
from tests.raw_http import exchange

VIEW_RE = re.compile(r'href="(http://[^"]+/v/[^"]+)"')


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def send_digest(user_id: str = "u1", **subscriber):
    sid = factories.subscriber(user_id, **subscriber)
    factories.events(
        user_id, 3, entity_id="p1", payload={"entity_title": "Launch notes", "entity_url": "https://example.test/p1"}
    )
    factories.events(user_id, 1, category="comment", entity_id="p2", actor=user_id, payload={"entity_title": "Roadmap"})
    run_id = factories.digest_run(sid)
    assert digest_send.process([run_id])["sent"] == 1
    return sid, run_id


def view_path_of(message) -> str:
    html = message.get_body(("html",)).get_content()
    return urlsplit(VIEW_RE.search(html).group(1)).path


def test_every_digest_links_to_its_hosted_copy_in_both_parts(sink, client, settings):
    settings(tracking=True)  # the view link is never a tracked click URL
    sid, run_id = send_digest()
    (message,) = sink.messages()
    path = view_path_of(message)
    claims = tokens.verify("view", path.removeprefix("/v/"))
    assert (claims.subscriber_id, claims.token_version, tokens.run_id(claims)) == (sid, 1, run_id)
    assert path in message.get_body(("plain",)).get_content()
    assert db.query("SELECT count(*) FROM email_links WHERE url LIKE '%%/v/%%'") == [(0,)]

    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "Launch notes" in r.text and 'href="https://example.test/p1"' in r.text  # direct link
    assert "/o/" not in r.text and "/c/" not in r.text  # no pixel, no tracking
    assert "View in your browser" not in r.text and "This digest was sent on" in r.text
    csp = r.headers["content-security-policy"]
    assert "script" not in csp and "default-src 'none'" in csp and "img-src https:" in csp
    assert r.headers["cache-control"] == "no-store" and r.headers["referrer-policy"] == "no-referrer"


def test_the_copy_shows_what_the_mail_showed(sink, client):
    send_digest()
    (message,) = sink.messages()
    mail_html = message.get_body(("html",)).get_content()
    page = client.get(view_path_of(message)).text
    titles = lambda html: re.findall(r'class="item-title"[^>]*>(?:<a [^>]*>)?([^<]+)<', html)  # noqa: E731
    assert titles(page) == titles(mail_html) == ["Launch notes"]  # own activity not shown in either
    assert "Hi Ana, here is your daily digest" in page and "Your first digest: 3 updates." in page


def test_the_link_dies_with_the_token_version(sink, client):
    sid, _ = send_digest()
    path = view_path_of(sink.messages()[0])
    assert client.get(path).status_code == 200
    db.query("UPDATE subscribers SET token_version = token_version + 1 WHERE id = %s", (sid,))
    r = client.get(path)
    assert r.status_code == 404 and "Link not found" in r.text


def test_only_the_subscribers_own_sent_runs(sink, client):
    send_digest("u1")
    other, other_run = send_digest("u2", email="u2@example.test")
    me = db.query("SELECT id FROM subscribers WHERE user_id = 'u1'")[0][0]
    assert client.get("/v/" + tokens.make("view", me, 1, f"run:{other_run}")).status_code == 404
    pending = factories.digest_run(me, period="2030-01-01")
    assert client.get("/v/" + tokens.make("view", me, 1, f"run:{pending}")).status_code == 404
    assert client.get("/v/" + tokens.make("view", other, 1, f"run:{other_run}")).status_code == 200


def test_after_retention_the_page_says_so(sink, client, settings):
    settings(retention_days=90)
    _, run_id = send_digest()
    path = view_path_of(sink.messages()[0])
    handled = [
        e
        for e, r in digest_marks.handled_by(i for (i,) in db.query("SELECT id FROM digest_events")).items()
        if r == run_id
    ]
    db.query("DELETE FROM digest_events WHERE id = ANY (%s)", (handled,))  # what dropping the month does
    r = client.get(path)
    assert r.status_code == 410
    assert "no longer available" in r.text and "90 days" in r.text


@pytest.mark.parametrize(
    "token",
    [
        "%00",
        "%ff%fe",
        "a" * 5000,
        "x.y",
        "not-base64!.@@@",
        "djE6MToxOnJ1bjox.AAAAAAAAAAAAAAAAAAAAAA",
        "%E2%80%AE",
        "٣.٣",
        "djE6MToxOnJ1bjox",
        "a.b.c",
        "%0d%0aSet-Cookie:x=1",
    ],
)
def test_hostile_tokens_get_the_404_page(client, token):
    factories.subscriber("u1")
    r = client.get("/v/" + token)
    assert r.status_code == 404 and "Link not found" in r.text and "set-cookie" not in r.headers


@pytest.mark.parametrize("path", ["/v/..", "/v/%2e%2e", "/v/.", "/v/", "/v/a/b"])
def test_paths_that_are_no_token_are_not_found(live_server, path):
    # Sent byte for byte: a client library resolves the dot segments first (`/v/..` would ask for `/`).
    raw = exchange(live_server, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert raw.split(b" ", 2)[1] == b"404", raw[:200]


@pytest.mark.parametrize(
    "scope", [None, "run:", "run:abc", "run:-1", "run:1.5", "run:٣", "run:" + "9" * 19, "category:likes", "run:1:2"]
)
def test_signed_tokens_without_a_usable_run_get_404(client, scope):
    sid = factories.subscriber("u1")
    assert client.get("/v/" + quote(tokens.make("view", sid, 1, scope))).status_code == 404
    # a valid unsubscribe token is not a view token, whatever its scope
    assert client.get("/v/" + tokens.make("unsubscribe", sid, 1, "run:1")).status_code == 404
