"""The feed in the browser (issue 24, item 4): feed tokens bound to one subscriber, /v1/feed*, CORS
for FEED_ALLOWED_ORIGINS only, and the Server-Sent Events stream (real uvicorn, real sockets)."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from app.platform import db, tokens
from app.web.api import feed_browser
from tests import factories
from tests.conftest import auth, wait_for

ORIGIN = "https://app.example.test"


def mint(client, admin_key, user_id="u1", **params):
    r = client.post(f"/v1/subscribers/{user_id}/feed-token", params=params, headers=auth(admin_key))
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def two(client, admin_key):
    """u1 and u2 with one entity each; u1's feed token."""
    factories.subscriber("u1")
    factories.subscriber("u2")
    factories.events("u1", 2, entity_id="p1")
    factories.events("u2", 1, entity_id="secret")
    return mint(client, admin_key)["token"]


def test_minting_a_token(client, admin_key, events_key):
    factories.subscriber("u1")
    before = int(time.time())
    body = mint(client, admin_key)
    assert before + 3600 <= body["expires_at"] <= int(time.time()) + 3600
    assert mint(client, admin_key, ttl_seconds="10")["expires_at"] <= int(time.time()) + 10
    assert mint(client, admin_key, ttl_seconds="999999")["expires_at"] <= int(time.time()) + 3600  # capped
    assert client.post("/v1/subscribers/nobody/feed-token", headers=auth(admin_key)).status_code == 404
    assert client.post("/v1/subscribers/u1/feed-token", headers=auth(events_key)).status_code == 403
    r = client.post("/v1/subscribers/u1/feed-token", params={"ttl_seconds": "0"}, headers=auth(admin_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "ttl_seconds"


def test_a_token_reads_its_own_feed(client, admin_key, two):
    own = client.get("/v1/feed", headers=auth(two))
    assert own.status_code == 200
    assert own.json() == client.get("/v1/subscribers/u1/feed", headers=auth(admin_key)).json()
    assert [i["entity_id"] for i in own.json()["items"]] == ["p1"]
    assert client.get("/v1/feed", params={"limit": "0"}, headers=auth(two)).status_code == 422


def test_a_token_marks_its_own_feed_only(client, two):
    body = {"entities": [{"entity_type": "post", "entity_id": "secret"}, {"entity_type": "post", "entity_id": "p1"}]}
    assert client.post("/v1/feed/read", json=body, headers=auth(two)).status_code == 202
    assert client.post("/v1/feed/seen", json={"all": True}, headers=auth(two)).status_code == 202
    # every mark is u1's (id 1), whatever ids the body names; u2 has no state
    assert {
        sid
        for (sid,) in db.query("SELECT subscriber_id FROM feed_state UNION SELECT subscriber_id FROM feed_state_all")
    } == {1}
    assert client.post("/v1/feed/seen", json={"entities": []}, headers=auth(two)).status_code == 422


def test_a_token_opens_nothing_else(client, two):
    assert client.get("/v1/subscribers/u2/feed", headers=auth(two)).status_code == 401
    assert client.get("/v1/subscribers/u1/feed", headers=auth(two)).status_code == 401
    assert client.post("/v1/subscribers/u2/seen", json={"all": True}, headers=auth(two)).status_code == 401
    assert client.post("/v1/subscribers/u1/feed-token", headers=auth(two)).status_code == 401
    assert client.get("/v1/subscribers/u1", headers=auth(two)).status_code == 401
    assert client.post("/v1/events", json={}, headers=auth(two)).status_code == 401
    assert db.query("SELECT count(*) FROM feed_state_all") == [(0,)]


def test_an_api_key_is_not_a_feed_token(client, admin_key, two):
    assert client.get("/v1/feed", headers=auth(admin_key)).status_code == 401
    assert client.get("/v1/feed").status_code == 401


@pytest.mark.parametrize(
    "make",
    [
        lambda: tokens.feed_token(1, 1, int(time.time()) - 1),  # expired
        lambda: tokens.make("unsubscribe", 1, 1),  # another purpose
        lambda: tokens.make("feed", 1, 1),  # no expiry
        lambda: tokens.feed_token(1, 2, int(time.time()) + 60),  # an older token_version... or a newer one
        lambda: tokens.feed_token(1, 1, int(time.time()) + 60)[:-2] + "AA",  # forged MAC
        lambda: tokens.feed_token(99, 1, int(time.time()) + 60),  # nobody
    ],
)
def test_expired_forged_and_foreign_tokens_are_401(client, two, make):
    r = client.get("/v1/feed", headers=auth(make()))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"


def test_bumping_token_version_revokes_tokens(client, two):
    assert client.get("/v1/feed", headers=auth(two)).status_code == 200
    db.query("UPDATE subscribers SET token_version = token_version + 1 WHERE user_id = 'u1'")
    assert client.get("/v1/feed", headers=auth(two)).status_code == 401


def test_cors_only_for_the_allowed_origins(client, admin_key, two, settings):
    settings(feed_allowed_origins=(ORIGIN,))
    pre = client.options(
        "/v1/feed/read",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in pre.headers  # bearer tokens, never cookies
    other = client.options(
        "/v1/feed", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
    )
    assert other.status_code == 204 and "access-control-allow-origin" not in other.headers  # the browser refuses
    ok = client.get("/v1/feed", headers={"Origin": ORIGIN, **auth(two)})
    assert ok.headers["access-control-allow-origin"] == ORIGIN and ok.headers["vary"] == "Origin"
    denied = client.get("/v1/feed", headers={"Origin": ORIGIN, **auth("nope")})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    evil = client.get("/v1/feed", headers={"Origin": "https://evil.example", **auth(two)})
    assert "access-control-allow-origin" not in evil.headers
    # the server-side API is never opened to browsers
    admin = client.get("/v1/subscribers/u1/feed", headers={"Origin": ORIGIN, **auth(admin_key)})
    assert "access-control-allow-origin" not in admin.headers


# -- the stream ------------------------------------------------------------------------------------


class Stream:
    """One SSE connection to the live server, read message by message (bounded by a read timeout)."""

    def __init__(self, base, token, last_event_id=None):
        headers = {"Authorization": f"Bearer {token}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self.client = httpx.Client(base_url=base, timeout=httpx.Timeout(20.0))
        self.cm = self.client.stream("GET", "/v1/feed/stream", headers=headers)
        self.response = self.cm.__enter__()
        self.lines = self.response.iter_lines()

    def next(self, heartbeat=False) -> dict:
        """The next message (or, heartbeat=True, the next heartbeat comment)."""
        fields: dict = {}
        for line in self.lines:
            if line == "":
                if fields:
                    return fields
                continue
            if line.startswith(":"):
                if heartbeat:
                    return {"comment": line}
                continue
            name, _, value = line.partition(": ")
            fields[name] = orjson.loads(value) if name == "data" else value
        raise AssertionError("stream ended")

    def close(self):
        self.cm.__exit__(None, None, None)
        self.client.close()


@pytest.fixture
def fast_stream(settings):
    settings(feed_stream_poll_seconds=0.05, feed_stream_heartbeat_seconds=0.3, feed_stream_max_connections=2)


def test_the_stream_sends_counts_new_items_and_heartbeats(live_server, client, two, fast_stream):
    stream = Stream(live_server, two)
    try:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        first = stream.next()
        assert first["event"] == "feed" and first["retry"] == "3000"
        assert first["data"] == {"unseen_count": 1, "unread_count": 1, "items": []}
        first_id = int(first["id"])
        (new_id,) = factories.events("u1", 1, entity_id="p2", actor="bo", actor_name="Bo")
        factories.events("u2", 1, entity_id="not-yours")
        msg = stream.next()
        assert int(msg["id"]) == new_id > first_id
        assert msg["data"]["unseen_count"] == 2
        assert [(i["entity_id"], i["summary"]) for i in msg["data"]["items"]] == [("p2", "Like from Bo")]
        assert client.post("/v1/feed/seen", json={"all": True}, headers=auth(two)).status_code == 202
        msg = stream.next()
        assert msg["data"] == {"unseen_count": 0, "unread_count": 2, "items": []}
        assert stream.next(heartbeat=True) == {"comment": ": heartbeat"}
    finally:
        stream.close()
    # reconnecting with Last-Event-ID: what was missed comes at once
    again = Stream(live_server, two, last_event_id=first_id)
    try:
        assert [i["entity_id"] for i in again.next()["data"]["items"]] == ["p2"]
    finally:
        again.close()


def test_open_streams_are_bounded_per_process(live_server, two, fast_stream, settings):
    settings(feed_stream_max_connections=1)
    one = Stream(live_server, two)
    try:
        one.next()
        r = httpx.get(f"{live_server}/v1/feed/stream", headers=auth(two), timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
    finally:
        one.close()
    wait_for(lambda: feed_browser.slots.open == 0, 20, "the closed stream's slot")
    two_ = Stream(live_server, two)
    try:
        assert two_.response.status_code == 200
    finally:
        two_.close()
    wait_for(lambda: feed_browser.slots.open == 0, 20, "the slot back")


def test_the_stream_needs_a_feed_token(live_server, admin_key):
    r = httpx.get(f"{live_server}/v1/feed/stream", headers=auth(admin_key), timeout=10)
    assert r.status_code == 401 and feed_browser.slots.open == 0


def test_the_stream_ends_when_the_token_is_revoked(live_server, two, fast_stream):
    stream = Stream(live_server, two)
    try:
        stream.next()
        db.query("UPDATE subscribers SET token_version = token_version + 1 WHERE user_id = 'u1'")
        with pytest.raises(AssertionError, match="stream ended"):
            stream.next()
    finally:
        stream.close()
    wait_for(lambda: feed_browser.slots.open == 0, 20, "the ended stream's slot")
