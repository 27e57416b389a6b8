"""What `api_route` (app/platform/openapi.py) does with an Operation's declarations before and after the
endpoint runs: the path parameters, the query and the body validated, the endpoint handed the values
and no raw JSON, a typed result serialised with the declared model, and every domain error
(app/platform/errors.py) answered in the one place, in the API's error shape. On a small app of its
own: no database, no Redis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

from app.platform import errors
from app.platform.http import ApiError, exception_handlers
from app.platform.openapi import Operation, api_route
from app.platform.validation import Body, Text, Timestamp

pytestmark = pytest.mark.pure

SEEN: list[dict[str, Any]] = []


class ThingInput(Body):
    name: Text(20, min_length=1)
    size: int = 1


class Thing(BaseModel):
    key: str
    name: str
    size: int
    note: str | None = None
    at: Timestamp | None = None


class ThingQuery(Body):
    model_config = {**Body.model_config, "strict": False}
    limit: Annotated[int, Field(ge=1, le=10)] = 5


@dataclass
class Stored:  # what a service might return: the route serialises it with the declared model
    key: str
    name: str
    size: int


async def put_thing(request: Request, key: str, body: ThingInput):
    SEEN.append({"key": key, "body": body})
    if body.name == "conflict":
        raise errors.Conflict("that thing is busy", "busy")
    if body.name == "gone":
        raise errors.Unavailable("the store is down", retry_after=7)
    if body.name == "bad":
        raise errors.Invalid("name", "is not a name we take")
    created = key == "new"
    return Thing(key=key, name=body.name, size=body.size), 201 if created else 200


async def get_thing(request: Request, key: str, query: ThingQuery):
    if key == "missing":
        raise errors.NotFound("no thing with that key")
    if key == "stored":
        return Stored(key, "from a dataclass", query.limit)
    return Thing(key=key, name="n", size=query.limit, at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))


async def thing(request: Request, **declared):
    return await (get_thing if request.method in ("GET", "HEAD") else put_thing)(request, **declared)


def _app() -> Starlette:
    route = api_route(
        "/v1/things/{key}",
        thing,
        path_params={"key": TypeAdapter(Text(10, min_length=1))},
        put=Operation(
            "Put a thing",
            {200: ("replaced", Thing), 201: ("created", Thing)},
            errors=(400, 409, 413, 422, 503),
            body=ThingInput,
            body_limit=200,
            echo="key",
        ),
        get=Operation("Read a thing", {200: ("the thing", Thing)}, errors=(404, 422), query=ThingQuery),
    )
    return Starlette(routes=[route], exception_handlers=exception_handlers())


@pytest.fixture
def client():
    SEEN.clear()
    with TestClient(_app()) as c:
        yield c


def test_the_endpoint_gets_the_validated_body_and_path_and_its_result_is_serialised(client):
    r = client.put("/v1/things/new", json={"name": "ana", "key": "new"})
    # Fields the result was not given are absent, not null (as the dicts the services returned had them).
    assert (r.status_code, r.json()) == (201, {"key": "new", "name": "ana", "size": 1})
    assert [{"key": "new", "body": ThingInput(name="ana")}] == SEEN
    assert client.put("/v1/things/old", json={"name": "bo", "size": 3}).status_code == 200


def test_a_bad_body_is_a_422_naming_each_field_and_the_endpoint_never_runs(client):
    r = client.put("/v1/things/x", json={"name": "", "size": "3", "extra": 1, "key": "y"})
    assert r.status_code == 422
    assert r.json() == {
        "error": "validation_failed",
        "message": "4 problem(s) in the request; nothing was stored",
        "errors": [
            {"field": "name", "message": "must not be empty"},
            {"field": "size", "message": "must be an integer"},
            {"field": "extra", "message": "unknown field"},
            {"field": "key", "message": "does not match the URL"},
        ],
    }
    assert SEEN == []


def test_body_reading_keeps_its_limits_and_errors(client):
    assert client.put("/v1/things/x", content=b"{nope").json()["error"] == "malformed_json"
    assert client.put("/v1/things/x", content=b"").status_code == 400
    r = client.put("/v1/things/x", content=b'{"name": "' + b"a" * 300 + b'"}')
    assert (r.status_code, r.json()["error"]) == (413, "body_too_large")
    assert SEEN == []


def test_a_bad_path_parameter_is_a_422_before_the_body_is_read(client):
    r = client.put("/v1/things/" + "k" * 11, content=b"{nope")
    assert r.status_code == 422
    assert r.json()["errors"] == [{"field": "key", "message": "must be at most 10 characters"}]


def test_the_query_is_validated_and_handed_over(client):
    assert client.get("/v1/things/a?limit=7").json()["size"] == 7
    r = client.get("/v1/things/a?limit=70")
    assert (r.status_code, r.json()["errors"]) == (422, [{"field": "limit", "message": "must be at most 10"}])


def test_timestamps_keep_their_isoformat_and_a_dataclass_is_read_by_attribute(client):
    assert client.get("/v1/things/a").json()["at"] == "2026-01-02T03:04:05+00:00"
    assert client.get("/v1/things/stored").json() == {"key": "stored", "name": "from a dataclass", "size": 5}


@pytest.mark.parametrize(
    ("request_args", "status", "body", "headers"),
    [
        (("get", "/v1/things/missing"), 404, {"error": "not_found", "message": "no thing with that key"}, {}),
        (
            ("put", "/v1/things/a", {"name": "conflict"}),
            409,
            {"error": "conflict", "message": "that thing is busy"},
            {},
        ),
        (
            ("put", "/v1/things/a", {"name": "gone"}),
            503,
            {"error": "unavailable", "message": "the store is down"},
            {"retry-after": "7"},
        ),
        (
            ("put", "/v1/things/a", {"name": "bad"}),
            422,
            {
                "error": "validation_failed",
                "message": "1 problem(s) in the request; nothing was stored",
                "errors": [{"field": "name", "message": "is not a name we take"}],
            },
            {},
        ),
    ],
)
def test_domain_errors_are_answered_in_the_api_error_shape(client, request_args, status, body, headers):
    method, url, *json = request_args
    r = client.request(method, url, json=json[0] if json else None)
    assert (r.status_code, r.json()) == (status, body)
    for name, value in headers.items():
        assert r.headers[name] == value


def test_a_subclass_names_its_own_code():
    class Stopped(errors.Conflict):
        code = "sending_stopped"

    error = ApiError.of(Stopped("all mail is stopped"))
    assert (error.status, error.code, error.message, error.errors) == (
        409,
        "sending_stopped",
        "all mail is stopped",
        None,
    )


def test_declarations_that_cannot_be_enforced_are_refused():
    with pytest.raises(TypeError, match="needs a check"):
        Operation("two bodies", {200: "ok"}, body=(ThingInput, Thing))

    class Asgi:
        async def __call__(self, scope, receive, send) -> None: ...

    with pytest.raises(TypeError, match="ASGI app"):
        api_route("/v1/raw", Asgi(), post=Operation("raw", {200: "ok"}, body=ThingInput))
