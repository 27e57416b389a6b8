"""Category registry API (admin scope): register/replace, read, list, delete; the key and the body
are validated with field-named 422s; what a stranger can send never gets past validation."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from app.platform import db
from app.subscribers import categories
from app.web.api.categories import BODY_LIMIT
from tests.conftest import auth

BODY = {"label": "Comments", "description": "Replies to your posts", "verb": "commented on"}


def put(client, api_key, name="comment", **body):
    return client.put(f"/v1/categories/{quote(name, safe='')}", json={**BODY, **body}, headers=auth(api_key))


def test_register_read_list_replace_delete(client, admin_key):
    r = put(client, admin_key)
    assert r.status_code == 201
    assert r.json() == {
        "key": "comment",
        "label": "Comments",
        "description": "Replies to your posts",
        "verb": "commented on",
        "delivery": "digest",
        "translations": {},
    }
    assert client.get("/v1/categories/comment", headers=auth(admin_key)).json() == r.json()
    r = client.put(
        "/v1/categories/comment", json={"label": "Replies", "delivery": "immediate"}, headers=auth(admin_key)
    )
    assert r.status_code == 200  # PUT replaces: omitted fields take their defaults
    assert r.json() == {
        "key": "comment",
        "label": "Replies",
        "description": "",
        "verb": "",
        "delivery": "immediate",
        "translations": {},
    }
    put(client, admin_key, name="a.like:v2-x_y", label="Likes")
    listed = client.get("/v1/categories", headers=auth(admin_key)).json()["categories"]
    assert [c["key"] for c in listed] == ["a.like:v2-x_y", "comment"]
    # what GET returns can be PUT back
    got = client.get("/v1/categories/comment", headers=auth(admin_key)).json()
    assert client.put("/v1/categories/comment", json=got, headers=auth(admin_key)).status_code == 200
    assert client.delete("/v1/categories/comment", headers=auth(admin_key)).status_code == 204
    assert client.get("/v1/categories/comment", headers=auth(admin_key)).status_code == 404
    assert client.delete("/v1/categories/comment", headers=auth(admin_key)).status_code == 404


def test_a_change_is_seen_at_once_by_this_process(client, admin_key):
    assert "comment" not in categories.registry()
    put(client, admin_key)
    assert categories.registry()["comment"].label == "Comments"
    client.delete("/v1/categories/comment", headers=auth(admin_key))
    assert "comment" not in categories.registry()


@pytest.mark.parametrize(
    "name", ["a b", "é", "x" * 101, "<script>", "likes;drop", "%00", "ü\u202e", "a\tb", "..%2F..%2Fetc"]
)
def test_bad_keys_are_422_naming_the_key(client, admin_key, name):
    r = client.put(f"/v1/categories/{quote(name, safe='%')}", json=BODY, headers=auth(admin_key))
    assert r.status_code in (404, 422)  # a path that is not one segment never reaches the route
    if r.status_code == 422:
        assert [e["field"] for e in r.json()["errors"]] == ["key"]
        assert "letters, digits" in r.json()["errors"][0]["message"]
    assert client.get(f"/v1/categories/{quote(name, safe='%')}", headers=auth(admin_key)).status_code in (404, 422)
    assert db.query("SELECT count(*) FROM categories") == [(0,)]


@pytest.mark.parametrize(
    "field,value",
    [
        ("label", ""),
        ("label", "   "),
        ("label", "two\nlines"),
        ("label", "x" * 101),
        ("label", 5),
        ("label", None),
        ("description", "x" * 501),
        ("description", "bell\x07"),
        ("verb", "y" * 61),
        ("verb", "a\r\nBcc: x"),
        ("delivery", "later"),
        ("delivery", "DIGEST"),
        ("colour", "blue"),
        ("key", "other"),
    ],
)
def test_invalid_bodies_are_422_naming_the_field_and_nothing_saved(client, admin_key, field, value):
    r = put(client, admin_key, **{field: value})
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert db.query("SELECT count(*) FROM categories") == [(0,)]


def test_label_is_required_and_body_must_be_an_object(client, admin_key):
    r = client.put("/v1/categories/comment", json={"verb": "x"}, headers=auth(admin_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "label"
    r = client.put("/v1/categories/comment", json=["label"], headers=auth(admin_key))
    assert r.status_code == 422
    r = client.put("/v1/categories/comment", content=b"{nope", headers=auth(admin_key))
    assert r.status_code == 400
    r = client.put("/v1/categories/comment", content=b"{" + b" " * BODY_LIMIT + b"}", headers=auth(admin_key))
    assert r.status_code == 413


def test_odd_unicode_labels_are_kept_as_text(client, admin_key):
    label = "Kommentare 💬 \u202eevil <b>&amp;"
    r = put(client, admin_key, label=label)
    assert r.status_code == 201 and r.json()["label"] == label


def test_only_admin_keys(client, events_key):
    assert client.put("/v1/categories/comment", json=BODY).status_code == 401
    assert client.put("/v1/categories/comment", json=BODY, headers=auth("nope")).status_code == 401
    assert put(client, events_key).status_code == 403
    assert client.get("/v1/categories", headers=auth(events_key)).status_code == 403
    assert client.delete("/v1/categories/comment", headers=auth(events_key)).status_code == 403


def test_openapi_documents_the_routes_and_bodies(client):
    doc = client.get("/openapi.json").json()
    assert set(doc["paths"]["/v1/categories/{key}"]) == {"put", "get", "delete"}
    schema = doc["components"]["schemas"]["CategoryInput"]
    assert schema["required"] == ["label"] and schema["properties"]["label"]["maxLength"] == 100
    assert schema["properties"]["delivery"]["enum"] == ["digest", "immediate"]
    assert "Category" in doc["components"]["schemas"]
