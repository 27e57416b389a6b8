"""JSON everywhere under /v1 and /webhooks: the router's own 404 and 405 answer in the API's error
shape (405 with Allow); `/` is a small HTML page with the ways in; `/docs` is Swagger UI served by
the app itself from a packaged copy — every asset it references is fetched from the app."""

from __future__ import annotations

import json
import re
from urllib.parse import urljoin

import pytest
import swagger_ui_bundle
from starlette.routing import Match, Route
from starlette.testclient import TestClient

from app.web import create_app
from tests.raw_http import exchange

pytestmark = pytest.mark.varies_input("the router's error shapes and /docs, over the request path's pooled units")

UNKNOWN_PATHS = [
    "/v1/nope",
    "/v1",
    "/v1/",
    "/v1/subscribers",
    "/v1/subscribers/a/b",
    "/v1/newsletters/1/frobnicate",
    "/webhooks",
    "/webhooks/sparkpost",  # (mailgun, ses and postmark have routes since issue 38)
    "/webhooks/sendgrid/extra",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
# (path, a method the route does not take)
WRONG_METHODS = [
    ("/v1/events", "GET"),
    ("/v1/events", "DELETE"),
    ("/v1/subscribers/ana", "POST"),
    ("/v1/categories", "POST"),
    ("/v1/newsletters/1/send", "GET"),
    ("/v1/newsletters/1", "DELETE"),
    ("/webhooks/sendgrid", "GET"),
    ("/webhooks/sendgrid", "PUT"),
]


def _assert_api_error(response, status: int, code: str):
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == code and body["message"], body


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", UNKNOWN_PATHS)
def test_unknown_api_paths_are_json_404s(client, path, method):
    _assert_api_error(client.request(method, path), 404, "not_found")


def _route_methods(app, path: str) -> set[str]:
    """The methods the app's routes take at this path (every route that matches it)."""
    scope = {"type": "http", "path": path, "method": "GET", "root_path": ""}
    methods = set()
    for route in app.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= route.methods
    return methods


@pytest.mark.parametrize(("path", "method"), WRONG_METHODS)
def test_wrong_methods_on_known_routes_are_json_405s_with_allow(client, path, method):
    response = client.request(method, path)
    _assert_api_error(response, 405, "method_not_allowed")
    allowed = {m.strip() for m in response.headers["allow"].split(",")}
    assert allowed == _route_methods(client.app, path) and method not in allowed


def test_outside_the_api_a_404_stays_plain(client):
    response = client.get("/no-such-page")
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/plain")


def test_odd_path_bytes_get_the_json_shape(live_server):
    """Bytes a client library would clean up: percent-encoded NUL, invalid UTF-8, raw high bytes,
    an encoded slash, dot segments, a very long segment."""
    paths = [
        b"/v1/%00",
        b"/v1/%ff%fe",
        b"/v1/\xff\xfe",
        b"/v1/%ED%A0%80",  # an encoded UTF-16 surrogate: not UTF-8 that Python can decode
        b"/v1/events%2Fx",
        b"/v1/a/../../webhooks/x",
        b"/webhooks/%00%ff",
        b"/v1/" + b"x" * 4000,
    ]
    for path in paths:
        for method in (b"GET", b"POST", b"DELETE"):
            raw = exchange(
                live_server,
                method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            head, _, body = raw.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            assert status in (400, 404), (path, method, head)
            if status == 404:
                assert b"content-type: application/json" in head.lower(), (path, head)
                assert json.loads(body)["error"] == "not_found", (path, body)


def test_root_page_links_the_ways_in(client, settings):
    settings(  # APP_ENV=test: a development env
        mail_viewer_url="http://127.0.0.1:18025/dev/mail", feed_demo_url="http://127.0.0.1:18026/?user=demo-ana"
    )
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    links = set(re.findall(r'href="([^"]+)"', page.text.replace("&amp;", "&")))
    expected = {"/docs", "/openapi.json", "/admin", "http://127.0.0.1:18025/dev/mail"}
    assert expected | {"http://127.0.0.1:18026/?user=demo-ana"} <= links
    for link in ("/docs", "/openapi.json"):
        assert client.get(link).status_code == 200, link


def test_root_page_shows_no_development_tools_in_production(client, settings):
    settings(
        env="production",
        mail_viewer_url="http://127.0.0.1:18025/dev/mail",
        feed_demo_url="http://127.0.0.1:18026/?user=demo-ana",
    )
    page = client.get("/")
    assert page.status_code == 200
    assert "18025" not in page.text and "18026" not in page.text and "/docs" in page.text


def test_docs_page_and_every_asset_come_from_the_app(client):
    """Offline by construction: every script, stylesheet and icon /docs references is a local path
    the app serves, and the initializer points Swagger UI at the app's own /openapi.json."""
    page = client.get("/docs")
    assert page.status_code == 200
    assert "'unsafe-eval'" not in page.headers["content-security-policy"]
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs, page.text
    assert not [r for r in refs if re.match(r"(?:[a-z]+:)?//", r)], refs  # nothing from another host
    kinds = set()
    for ref in refs:
        asset = client.get(urljoin("http://testserver/docs", ref))
        assert asset.status_code == 200, ref
        assert asset.content, ref
        kinds.add(asset.headers["content-type"].split(";")[0])
    assert {"text/css", "text/javascript"} <= kinds
    bundle = client.get(next(r for r in refs if r.endswith("swagger-ui-bundle.js"))).text
    assert "SwaggerUIBundle" in bundle
    initializer = client.get("/static/docs.js").text
    assert "SwaggerUIBundle(" in initializer and 'data-url="/openapi.json"' in page.text
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")


def test_swagger_ui_copy_renders_openapi_3_1():
    """Swagger UI reads OpenAPI 3.1 documents from 5.0 on (the 4.x copy of swagger-ui-bundle does not)."""
    version = re.search(r"swagger-ui-(\d+)\.", str(swagger_ui_bundle.swagger_ui_path)).group(1)
    assert int(version) >= 5


def test_an_unexpected_error_is_json_under_the_api_and_plain_elsewhere():
    def boom(request):
        raise ZeroDivisionError("boom")

    app = create_app()
    app.router.routes[:0] = [Route("/v1/boom", boom), Route("/boom", boom)]
    with TestClient(app, raise_server_exceptions=False) as c:
        _assert_api_error(c.get("/v1/boom"), 500, "internal_error")
        plain = c.get("/boom")
        assert plain.status_code == 500 and plain.headers["content-type"].startswith("text/plain")
