"""POST /v1/events: auth, validation (all-or-nothing), size limits, idempotency, concurrency."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from app.platform import apikeys, db
from tests.conftest import auth


def event(i=1, **over) -> dict:
    e = {
        "id": f"evt-{i}",
        "user_id": "u1",
        "category": "likes",
        "entity_type": "post",
        "entity_id": "p1",
        "actor_id": "a1",
        "actor_name": "Ana",
        "payload": {"title": "Hello"},
        "occurred_at": "2026-11-21T09:30:00Z",
    }
    e.update(over)
    return {k: v for k, v in e.items() if v is not ...}


def count_events() -> int:
    return db.query("SELECT count(*) FROM digest_events")[0][0]


def test_single_event_is_stored(client, events_key):
    r = client.post("/v1/events", json=event(), headers=auth(events_key))
    assert r.status_code == 202
    assert r.json() == {"accepted": 1, "duplicates": 0}
    row = db.query(
        "SELECT source, producer_id, user_id, category, entity_type, entity_id, actor_name, "
        "payload, occurred_at, digest_run_id FROM digest_events"
    )[0]
    assert row[:7] == ("producer-test", "evt-1", "u1", "likes", "post", "p1", "Ana")
    assert row[7] == {"title": "Hello"}
    assert row[8].isoformat() == "2026-11-21T09:30:00+00:00"
    assert row[9] is None


def test_batch_and_duplicates(client, events_key):
    batch = {"events": [event(i) for i in range(5)] + [event(0)]}
    r = client.post("/v1/events", json=batch, headers=auth(events_key))
    assert r.status_code == 202 and r.json() == {"accepted": 5, "duplicates": 1}
    r = client.post("/v1/events", json={"events": [event(3), event(9)]}, headers=auth(events_key))
    assert r.json() == {"accepted": 1, "duplicates": 1}
    assert count_events() == 6


def test_same_id_from_two_producers_are_two_events(client, events_key):
    other = apikeys.create("other-producer", "events")
    assert client.post("/v1/events", json=event(), headers=auth(events_key)).json()["accepted"] == 1
    assert client.post("/v1/events", json=event(), headers=auth(other)).json()["accepted"] == 1
    assert count_events() == 2


def test_events_for_unknown_user_are_kept(client, events_key):
    r = client.post("/v1/events", json=event(user_id="nobody-yet"), headers=auth(events_key))
    assert r.status_code == 202
    assert db.query("SELECT user_id FROM digest_events") == [("nobody-yet",)]


def test_occurred_at_defaults_to_now(client, events_key):
    client.post("/v1/events", json=event(occurred_at=...), headers=auth(events_key))
    assert db.query("SELECT occurred_at > now() - interval '1 minute' FROM digest_events") == [(True,)]


@pytest.mark.parametrize(
    "headers,code",
    [
        ({}, 401),
        ({"Authorization": "Bearer nk_not-a-key"}, 401),
        ({"Authorization": "Basic abc"}, 401),
    ],
)
def test_auth_errors(client, headers, code):
    r = client.post("/v1/events", json=event(), headers=headers)
    assert r.status_code == code
    assert r.json()["error"] == "unauthorized"
    assert count_events() == 0


def test_revoked_key_is_rejected(client, events_key):
    assert client.post("/v1/events", json=event(), headers=auth(events_key)).status_code == 202
    apikeys.revoke("producer-test")
    r = client.post("/v1/events", json=event(2), headers=auth(events_key))
    assert r.status_code == 401 and "revoked" in r.json()["message"]


def test_malformed_json_is_400(client, events_key):
    r = client.post(
        "/v1/events", content=b'{"id": "x",', headers={**auth(events_key), "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"
    r = client.post("/v1/events", content=b"", headers=auth(events_key))
    assert r.status_code == 400


def test_invalid_event_in_batch_stores_nothing_and_names_fields(client, events_key):
    bad = {
        "events": [
            event(1),
            event(2, user_id=...),  # missing
            event(3, payload=[1, 2]),  # not an object
            event(4, occurred_at="yesterday"),
            event(5, entity_id="x" * 201),
            event(6, surprise=True),
            "not an object",
        ]
    }
    r = client.post("/v1/events", json=bad, headers=auth(events_key))
    assert r.status_code == 422
    errors = {(e["index"], e["field"]) for e in r.json()["errors"]}
    assert errors == {
        (1, "user_id"),
        (2, "payload"),
        (3, "occurred_at"),
        (4, "entity_id"),
        (5, "surprise"),
        (6, "event"),
    }
    assert all(e["message"] for e in r.json()["errors"])
    assert count_events() == 0


@pytest.mark.parametrize(
    "value,field",
    [
        ({"id": "x", "user_id": "u", "category": "c", "entity_type": "t", "entity_id": ""}, "entity_id"),
        ({"id": "x", "user_id": 42, "category": "c", "entity_type": "t", "entity_id": "e"}, "user_id"),
        ({"id": "x", "user_id": "u\x00", "category": "c", "entity_type": "t", "entity_id": "e"}, "user_id"),
        (
            {
                "id": "x",
                "user_id": "u",
                "category": "c",
                "entity_type": "t",
                "entity_id": "e",
                "occurred_at": "2026-11-21T09:30:00",
            },
            "occurred_at",
        ),
        (
            {
                "id": "x",
                "user_id": "u",
                "category": "c",
                "entity_type": "t",
                "entity_id": "e",
                "payload": {"k": "a\x00b"},
            },
            "payload",
        ),
    ],
)
def test_single_event_field_errors(client, events_key, value, field):
    r = client.post("/v1/events", json=value, headers=auth(events_key))
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert "index" not in r.json()["errors"][0]


def test_batch_shape_errors(client, events_key):
    assert client.post("/v1/events", json={"events": []}, headers=auth(events_key)).status_code == 422
    assert client.post("/v1/events", json={"events": {}}, headers=auth(events_key)).status_code == 422
    assert client.post("/v1/events", json=[event()], headers=auth(events_key)).status_code == 422
    r = client.post("/v1/events", json={"events": [event(i) for i in range(1001)]}, headers=auth(events_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "events"


def test_integers_past_64_bits_are_refused_by_name_never_rounded(client, events_key):
    r = client.post(
        "/v1/events",
        content=b'{"id": "e1", "user_id": "u1", "category": "likes", "entity_type": "post", '
        b'"entity_id": "p1", "payload": {"n": 123456789012345678901234567890}}',
        headers={**auth(events_key), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "payload" and count_events() == 0
    r = client.post(
        "/v1/events",
        content=b'{"id": "e1", "user_id": "u1", "category": "likes", "entity_type": "post", '
        b'"entity_id": "p1", "payload": {"n": -9223372036854775809}}',  # -2**63 - 1: 19 digits
        headers={**auth(events_key), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "payload" and count_events() == 0
    big = 2**64 - 1  # the largest that fits: stored exactly
    r = client.post("/v1/events", json=event(id="e12345678901234567890", payload={"n": big}), headers=auth(events_key))
    assert r.status_code == 202
    assert db.query("SELECT producer_id, payload FROM digest_events") == [("e12345678901234567890", {"n": big})]


def test_payload_over_16_kib_is_rejected(client, events_key):
    r = client.post("/v1/events", json=event(payload={"blob": "x" * 16 * 1024}), headers=auth(events_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "payload"
    ok = client.post("/v1/events", json=event(payload={"blob": "x" * 16000}), headers=auth(events_key))
    assert ok.status_code == 202


def test_body_over_1_mib_is_413(client, events_key):
    big = (
        b'{"events": ['
        + b",".join([b'{"id": "%d", "payload": {"p": "%s"}}' % (i, b"x" * 15000) for i in range(80)])
        + b"]}"
    )
    assert len(big) > 1024 * 1024
    r = client.post("/v1/events", content=big, headers={**auth(events_key), "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert count_events() == 0


def test_body_over_limit_without_content_length_is_413(live_server, events_key):
    def chunks():
        for _ in range(20):
            yield b"x" * 100_000

    r = httpx.post(f"{live_server}/v1/events", content=chunks(), headers=auth(events_key))
    assert r.status_code == 413


def test_concurrent_duplicate_posts_store_one_row(live_server, events_key):
    """32 clients race to post the same ids: one row per id, and the counts add up."""
    same = {"events": [event(i) for i in range(50)]}

    def post(_):
        with httpx.Client(timeout=30) as c:
            return c.post(f"{live_server}/v1/events", json=same, headers=auth(events_key)).json()

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(post, range(64)))
    assert count_events() == 50
    assert sum(r["accepted"] for r in results) == 50
    assert sum(r["duplicates"] for r in results) == 64 * 50 - 50


def test_concurrent_inserts_from_two_writers_store_one_row(events_key):
    """Two independent group-commit writers (as in two web processes) racing on the same ids."""
    from digest.ingest import new_writer, validate_batch

    rows, errors = validate_batch([event(i) for i in range(200)], True, "producer-test")
    assert not errors
    writers = [new_writer(), new_writer()]
    futures = [w.submit(rows, size=len(rows)) for w in writers for _ in range(5)]
    results = [f.result(timeout=30) for f in futures]
    assert count_events() == 200
    assert sum(r.accepted for r in results) == 200


def test_database_down_answers_503_and_stores_nothing(client, events_key, monkeypatch):
    from digest import ingest

    broken = ingest.new_writer(url="postgresql://127.0.0.1:1/nowhere")
    monkeypatch.setattr(ingest.writer, "instance", broken)
    r = client.post("/v1/events", json=event(), headers=auth(events_key))
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert count_events() == 0


@pytest.mark.parametrize(
    "value,stored",
    [
        ("2026-11-21T09:30:00+17:46", "2026-11-20T15:44:00+00:00"),  # RFC 3339 allows it; Postgres would not
        ("2026-11-21T09:30:00.123456-03:00", "2026-11-21T12:30:00.123456+00:00"),
    ],
)
def test_occurred_at_offsets_are_normalised(client, events_key, value, stored):
    assert client.post("/v1/events", json=event(occurred_at=value), headers=auth(events_key)).status_code == 202
    assert db.query("SELECT occurred_at FROM digest_events")[0][0].isoformat() == stored


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_occurred_at_out_of_range_is_422(client, events_key, value):
    r = client.post("/v1/events", json=event(occurred_at=value), headers=auth(events_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "occurred_at"


def test_burst_on_a_cold_key_cache_never_exhausts_the_pool(live_server, events_key):
    """More concurrent requests than pooled connections, each needing a key lookup: they queue
    for a connection instead of failing (regression: MaxConnectionsExceeded -> 500)."""
    import asyncio

    async def burst():
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=120)) as c:
            return await asyncio.gather(
                *(c.post(f"{live_server}/v1/events", json=event(i), headers=auth(events_key)) for i in range(120))
            )

    statuses = [r.status_code for r in asyncio.run(burst())]
    assert statuses == [202] * 120
    assert count_events() == 120


def test_display_fields_are_stored_in_the_payload(client, events_key):
    r = client.post(
        "/v1/events",
        json=event(
            entity_title="Launch notes",
            entity_url="https://app.test/p/1",
            actor_avatar_url="https://cdn.test/ana.png",
            payload={"title": "Hello", "entity_url": "https://old.test/"},
        ),
        headers=auth(events_key),
    )
    assert r.status_code == 202
    # the documented fields win over the same keys in payload; the rest of payload is kept
    assert db.query("SELECT payload FROM digest_events")[0][0] == {
        "title": "Hello",
        "entity_title": "Launch notes",
        "entity_url": "https://app.test/p/1",
        "actor_avatar_url": "https://cdn.test/ana.png",
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("entity_url", "javascript:alert(1)"),
        ("entity_url", "/relative/path"),
        ("entity_url", "https://x.test/a b"),
        ("entity_url", 'https://x.test/"><script>'),
        ("entity_url", "https://x.test/" + "a" * 2000),
        ("actor_avatar_url", "data:image/png;base64,AAAA"),
        ("actor_avatar_url", "//cdn.test/a.png"),
        ("entity_title", "x" * 301),
        ("entity_title", 5),
    ],
)
def test_bad_display_fields_are_422_naming_the_field(client, events_key, field, value):
    r = client.post("/v1/events", json={"events": [event(1), event(2, **{field: value})]}, headers=auth(events_key))
    assert r.status_code == 422
    assert r.json()["errors"] == [{"index": 1, "field": field, "message": r.json()["errors"][0]["message"]}]
    assert count_events() == 0
