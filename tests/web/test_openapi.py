"""/openapi.json is generated from the route declarations (app/platform/openapi.py `api_route`): every
/v1 and /webhooks route is in it with each of its methods, the document holds together as OpenAPI 3
(every reference resolves, every path parameter is declared), and a declared scope is enforced."""

from __future__ import annotations

import re

import pytest
from starlette.routing import Route

from app.platform import openapi
from app.web import app

METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


@pytest.fixture
def document(client):
    return client.get("/openapi.json").json()


def _api_routes():
    return [r for r in app.routes if isinstance(r, Route) and r.path_format.startswith(("/v1/", "/webhooks/"))]


def test_every_api_and_webhook_route_is_documented_with_its_methods(document):
    routes = _api_routes()
    assert len(routes) >= 10
    for route in routes:
        assert isinstance(route, openapi.ApiRoute), f"{route.path} is not declared with api_route"
        documented = set(document["paths"][route.path_format])
        assert documented == {m.lower() for m in route.methods} - {"head"}, route.path


def test_the_document_is_structurally_valid_openapi_3(document):
    assert re.fullmatch(r"3\.1\.\d+", document["openapi"])
    assert document["info"]["title"] and document["info"]["version"]
    components = document["components"]
    schemes = components["securitySchemes"]

    def resolve(ref: str) -> dict:
        assert ref.startswith("#/"), ref
        node = document
        for part in ref[2:].split("/"):
            assert part in node, f"{ref} does not resolve"
            node = node[part]
        return node

    def refs(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(document):
        resolve(ref)

    for path, item in document["paths"].items():
        assert path.startswith("/")
        templated = set(re.findall(r"{([^}]+)}", path))
        assert item and set(item) <= METHODS, path
        for method, operation in item.items():
            where = f"{method} {path}"
            assert operation["summary"], where
            parameters = operation.get("parameters", [])
            keys = [(p["name"], p["in"]) for p in parameters]
            assert len(keys) == len(set(keys)), where
            assert {name for name, place in keys if place == "path"} == templated, where
            for parameter in parameters:
                assert parameter["in"] in {"path", "query", "header", "cookie"}, where
                assert "schema" in parameter, where
                if parameter["in"] == "path":
                    assert parameter["required"] is True, where
            for requirement in operation.get("security", []):
                assert set(requirement) <= set(schemes), where
            if "requestBody" in operation:
                assert operation["requestBody"]["content"]["application/json"]["schema"], where
            assert operation["responses"], where
            for status, response in operation["responses"].items():
                assert re.fullmatch(r"[1-5][0-9][0-9]", status), where
                response = resolve(response["$ref"]) if "$ref" in response else response
                assert response["description"], where


def test_a_declared_scope_is_documented_and_enforced(client, document):
    checked = 0
    for route in _api_routes():
        for method, operation in route.operations.items():
            if operation.scope is None:
                continue
            documented = document["paths"][route.path_format][method.lower()]
            assert documented["security"] == [{"bearer": []}]
            assert {"401", "403"} <= set(documented["responses"])
            url = route.path_format.format(**dict.fromkeys(route.param_convertors, "1"))
            assert client.request(method, url).status_code == 401, f"{method} {url}"
            checked += 1
    assert checked >= 10


def test_a_path_parameter_without_a_declared_type_is_refused():
    async def endpoint(request):
        raise AssertionError

    with pytest.raises(TypeError, match="thing_id"):
        openapi.api_route("/v1/things/{thing_id}", endpoint, get=openapi.Operation("a thing", {200: "it"}))
