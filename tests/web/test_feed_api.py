"""The feed (issue 24, item 3): one item per entity, newest activity first, grouped and worded as the
digest words it, with seen/unread state, counts for the badge, ?unread, ?limit, ?before paging."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.platform import db
from digest import build as digest_build
from digest import seen
from tests import factories
from tests.conftest import auth

NOW = datetime.now(UTC).replace(microsecond=0)


def get(client, key, user_id="u1", **params):
    return client.get(f"/v1/subscribers/{user_id}/feed", params=params, headers=auth(key))


def mark(sid, kind, entities=None, at=None):
    with db.raw_cursor() as cur:
        seen.mark(cur, sid, kind, at or datetime.now(UTC), entities)


@pytest.fixture
def feed_rows():
    """u1: p1 (3 likes, oldest), p2 (2 comments), p3 (1 like, newest); plus own and other people's."""
    sid = factories.subscriber("u1")
    factories.events("u1", 3, entity_id="p1", when=NOW - timedelta(hours=3))
    factories.events("u1", 2, entity_id="p2", category="comment", when=NOW - timedelta(hours=2))
    factories.events("u1", 1, entity_id="p3", when=NOW - timedelta(hours=1), payload={"entity_title": "Launch"})
    factories.events("u1", 1, entity_id="mine", actor="u1", when=NOW)  # own activity: never shown
    factories.events("u2", 4, entity_id="p9", when=NOW)  # somebody else's
    return sid


def test_one_item_per_entity_newest_first_worded_as_the_digest(client, admin_key, feed_rows):
    r = get(client, admin_key)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [i["entity_id"] for i in body["items"]] == ["p3", "p2", "p1"]
    assert body["unseen_count"] == 3 and body["unread_count"] == 3 and body["next_before"] is None
    p3, p2, p1 = body["items"]
    assert p3["title"] == "Launch" and p1["title"] == "Post p1"
    assert p1["count"] == 3 and p1["count_label"] == "3 updates"
    assert p1["summary"] == "Like from Actor a2, Actor a1 and Actor a0"
    assert [line["summary"] for line in p2["lines"]] == ["Comment from Actor a1 and Actor a0"]
    assert all(i["seen"] is False and i["unread"] is True for i in body["items"])
    assert p3["latest_at"] == (NOW - timedelta(hours=1, seconds=1)).isoformat()
    # the digest's own words for the same events
    text = digest_build.preview("u1").text
    for item in body["items"]:
        assert item["summary"] in text


def test_seen_and_read_state_per_item_and_the_counts(client, admin_key, feed_rows):
    # Marked at NOW, the clock the events use (a late worker may run this minutes after NOW was read).
    mark(feed_rows, "seen", [("post", "p3")], at=NOW)
    mark(feed_rows, "read", [("post", "p2")], at=NOW)
    body = get(client, admin_key).json()
    state = {i["entity_id"]: (i["seen"], i["unread"]) for i in body["items"]}
    assert state == {"p3": (True, True), "p2": (True, False), "p1": (False, True)}
    assert body["unseen_count"] == 1 and body["unread_count"] == 2
    only_unread = get(client, admin_key, unread="true").json()
    assert [i["entity_id"] for i in only_unread["items"]] == ["p3", "p1"]
    assert only_unread["unread_count"] == 2
    # new activity on a read entity makes it unseen and unread again
    factories.events("u1", 1, entity_id="p2", category="comment", actor="late", when=NOW + timedelta(minutes=1))
    body = get(client, admin_key).json()
    assert body["items"][0]["entity_id"] == "p2" and body["items"][0]["unread"] and not body["items"][0]["seen"]
    mark(feed_rows, "read", at=NOW + timedelta(hours=1))  # mark all
    body = get(client, admin_key).json()
    assert body["unseen_count"] == 0 and body["unread_count"] == 0
    assert get(client, admin_key, unread="true").json()["items"] == []


def test_paging_with_next_before(client, admin_key, feed_rows):
    first = get(client, admin_key, limit=2).json()
    assert [i["entity_id"] for i in first["items"]] == ["p3", "p2"] and first["next_before"]
    second = get(client, admin_key, limit=2, before=first["next_before"]).json()
    assert [i["entity_id"] for i in second["items"]] == ["p1"] and second["next_before"] is None
    assert second["unseen_count"] == 3  # the counts are the whole feed's


def test_opted_out_categories_are_left_out(client, admin_key, feed_rows):
    db.query("UPDATE subscribers SET category_opt_outs = '{comment}' WHERE id = %s", (feed_rows,))
    body = get(client, admin_key).json()
    assert [i["entity_id"] for i in body["items"]] == ["p3", "p1"] and body["unseen_count"] == 2


def test_sent_events_stay_in_the_feed(client, admin_key, feed_rows):
    rid = factories.digest_run(feed_rows, status="sent")
    db.query("UPDATE digest_events SET digest_run_id = %s WHERE user_id = 'u1'", (rid,))
    assert len(get(client, admin_key).json()["items"]) == 3


def test_an_empty_feed(client, admin_key):
    factories.subscriber("u1")
    assert get(client, admin_key).json() == {"unseen_count": 0, "unread_count": 0, "items": [], "next_before": None}


def test_unknown_subscriber_404_and_scope(client, admin_key, events_key):
    factories.subscriber("u1")
    assert get(client, admin_key, user_id="nobody").status_code == 404
    assert get(client, events_key).status_code == 403
    assert client.get("/v1/subscribers/u1/feed").status_code == 401


@pytest.mark.parametrize(
    "params,field",
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"unread": "yes"}, "unread"),
        ({"before": "not-a-cursor"}, "before"),
        ({"before": "12-"}, "before"),
        ({"page": "2"}, "page"),
    ],
)
def test_bad_query_is_422_naming_it(client, admin_key, params, field):
    factories.subscriber("u1")
    r = get(client, admin_key, **params)
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == [field]
