"""Seen and read state (issue 24, items 1 and 2): marks per entity and "all", idempotent, never
backwards, read implies seen, erased with the subscriber, pruned; the marking API's answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.platform import db
from digest import seen
from digest.group import Event
from tests import factories
from tests.conftest import auth

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def state():
    return db.query(
        "SELECT entity_type, entity_id, seen_until, read_until FROM feed_state ORDER BY entity_type, entity_id"
    )


def all_state():
    return db.query("SELECT subscriber_id, seen_until, read_until FROM feed_state_all")


def mark(kind, at, entities=None, sid=1):
    with db.raw_cursor() as cur:
        seen.mark(cur, sid, kind, at, entities)


def test_marks_are_idempotent_and_never_move_back():
    factories.subscriber("u1")
    mark("seen", T0, [("post", "p1"), ("post", "p1"), ("post", "p2")])
    mark("seen", T0, [("post", "p1")])
    mark("seen", T0 - timedelta(hours=1), [("post", "p1")])
    assert state() == [("post", "p1", T0, None), ("post", "p2", T0, None)]
    mark("seen", T0 + timedelta(hours=1), [("post", "p2")])
    assert state()[1] == ("post", "p2", T0 + timedelta(hours=1), None)


def test_read_implies_seen_and_seen_keeps_read():
    factories.subscriber("u1")
    mark("read", T0, [("post", "p1")])
    assert state() == [("post", "p1", T0, T0)]
    mark("seen", T0 + timedelta(minutes=5), [("post", "p1")])
    assert state() == [("post", "p1", T0 + timedelta(minutes=5), T0)]


def test_mark_all_is_one_row():
    factories.subscriber("u1")
    mark("seen", T0)
    mark("read", T0 - timedelta(minutes=1))
    mark("seen", T0 - timedelta(days=1))
    assert all_state() == [(1, T0, T0 - timedelta(minutes=1))]
    assert state() == []


def ev(i, entity, minutes):
    return Event(i, "like", "post", entity, f"a{i}", f"A{i}", T0 + timedelta(minutes=minutes))


def test_unseen_is_after_the_greatest_of_entity_and_all():
    factories.subscriber("u1")
    events = [ev(1, "p1", -10), ev(2, "p1", 10), ev(3, "p2", -10), ev(4, "p2", 30), ev(5, "p3", -20)]
    with db.raw_cursor() as cur:
        assert seen.load(cur, [1]) == {}
    assert seen.unseen(events, None) == events
    mark("seen", T0 + timedelta(minutes=20), [("post", "p2")])
    mark("seen", T0 - timedelta(minutes=15))
    with db.raw_cursor() as cur:
        marks = seen.load(cur, [1])[1]
    assert [e.id for e in seen.unseen(events, marks)] == [1, 2, 4]
    assert marks.seen_until(("post", "p2")) == T0 + timedelta(minutes=20)
    assert marks.seen_until(("post", "p1")) == T0 - timedelta(minutes=15)
    assert marks.read_until(("post", "p1")) is None


def test_state_goes_with_the_subscriber(client, admin_key):
    factories.subscriber("u1")
    mark("read", T0, [("post", "p1")])
    mark("seen", T0)
    assert client.delete("/v1/subscribers/u1", headers=auth(admin_key)).status_code == 204
    assert state() == [] and all_state() == []


def test_mark_all_drops_the_entity_rows_it_covers():
    factories.subscriber("u1")
    factories.subscriber("u2")
    mark("seen", T0, [("post", "p1"), ("post", "p2")])
    mark("read", T0, [("post", "p3")])
    mark("seen", T0 + timedelta(hours=1), [("post", "p4")])
    mark("seen", T0, [("post", "p1")], sid=2)
    mark("seen", T0 + timedelta(minutes=30))  # covers p1, p2; not p3 (read) nor p4 (later)
    assert [r[1] for r in state()] == ["p1", "p3", "p4"]  # u2's p1 stays
    mark("read", T0 + timedelta(minutes=30))
    assert [r[1] for r in state()] == ["p1", "p4"]


def test_prune_drops_rows_untouched_for_the_retention_days():
    factories.subscriber("u1")
    factories.subscriber("u2")
    mark("seen", T0, [("post", "new"), ("post", "old")])
    mark("seen", T0, sid=2)
    db.query("UPDATE feed_state SET updated_at = now() - interval '100 days' WHERE entity_id = 'old'")
    db.query("UPDATE feed_state_all SET updated_at = now() - interval '100 days'")
    with db.raw_cursor() as cur:
        assert seen.prune(cur, 0) == 0
        assert seen.prune(cur, 90) == 2
    assert [r[1] for r in state()] == ["new"] and all_state() == []


# -- the API ---------------------------------------------------------------------------------


def post(client, key, kind, body, user_id="u1"):
    return client.post(f"/v1/subscribers/{user_id}/{kind}", json=body, headers=auth(key))


@pytest.mark.parametrize("kind", ["seen", "read"])
def test_mark_entities_with_an_events_key(client, events_key, kind):
    factories.subscriber("u1")
    body = {"entities": [{"entity_type": "post", "entity_id": "p1"}], "read_at": "2026-11-20T10:00:00+01:00"}
    r = post(client, events_key, kind, body)
    assert r.status_code == 202
    assert state() == [("post", "p1", T0, T0 if kind == "read" else None)]


def test_mark_all_defaults_to_now(client, admin_key):
    factories.subscriber("u1")
    before = db.query("SELECT now()")[0][0]
    assert post(client, admin_key, "read", {"all": True}).status_code == 202
    [(sid, seen_until, read_until)] = all_state()
    assert sid == 1 and seen_until == read_until and seen_until >= before


def test_unknown_subscriber_is_404_and_nothing_written(client, admin_key):
    r = post(client, admin_key, "seen", {"all": True}, user_id="nobody")
    assert r.status_code == 404
    assert all_state() == []


@pytest.mark.parametrize(
    "body,field",
    [
        ({}, "entities"),
        ({"all": True, "entities": [{"entity_type": "post", "entity_id": "p1"}]}, "all"),
        ({"all": False}, "all"),
        ({"all": "yes"}, "all"),
        ({"entities": []}, "entities"),
        ({"entities": [{"entity_type": "post"}]}, "entity_id"),
        ({"entities": [{"entity_type": "post", "entity_id": ""}]}, "entity_id"),
        ({"entities": [{"entity_type": "post", "entity_id": "p", "x": 1}]}, "x"),
        ({"entities": [{"entity_type": "post", "entity_id": "p1"}] * 1001}, "entities"),
        ({"all": True, "read_at": "yesterday"}, "read_at"),
        ({"all": True, "read_at": "2026-11-20T10:00:00"}, "read_at"),
        ({"all": True, "seen": True}, "seen"),
        ([], "body"),
    ],
)
def test_bad_bodies_are_422_naming_the_field(client, admin_key, body, field):
    factories.subscriber("u1")
    r = post(client, admin_key, "seen", body)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]]
    assert state() == [] and all_state() == []


def test_an_item_error_names_its_index(client, admin_key):
    factories.subscriber("u1")
    body = {"entities": [{"entity_type": "post", "entity_id": "p1"}, {"entity_type": "post", "entity_id": 7}]}
    r = post(client, admin_key, "read", body)
    assert r.status_code == 422
    assert r.json()["errors"] == [{"index": 1, "field": "entity_id", "message": r.json()["errors"][0]["message"]}]


def test_marking_needs_a_key(client):
    factories.subscriber("u1")
    assert post(client, "nk_" + "x" * 30, "seen", {"all": True}).status_code == 401
    assert client.post("/v1/subscribers/u1/seen", json={"all": True}).status_code == 401


def test_a_thousand_entities_in_one_request(client, admin_key):
    factories.subscriber("u1")
    body = {"entities": [{"entity_type": "post", "entity_id": f"p{i}"} for i in range(1000)]}
    assert post(client, admin_key, "read", body).status_code == 202
    assert db.query("SELECT count(*) FROM feed_state WHERE read_until IS NOT NULL") == [(1000,)]
