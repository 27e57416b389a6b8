"""Every operation of the API reference shows one call (every required parameter, its body) and its
answer (issue 41), and each example is
what the API does: the models that validate a call and its answer accept the example, and the test
makes every call as its example shows it, in an order where each finds what it needs (the quick
start's subscriber, category, events and newsletter), then compares the real answer with the
example: its status, and the shape of its JSON (the same keys at every level, the same JSON type
wherever both sides hold a value)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from app.platform import openapi
from app.web import app
from tests.conftest import auth
from tracking import codes, links

# (method, path) in the order they are called; each finds what the ones before it made.
CALLS = [
    ("put", "/v1/categories/{key}"),
    ("get", "/v1/categories"),
    ("get", "/v1/categories/{key}"),
    ("put", "/v1/subscribers/{user_id}"),
    ("patch", "/v1/subscribers/{user_id}"),
    ("get", "/v1/subscribers/{user_id}"),
    ("post", "/v1/events"),
    ("get", "/v1/subscribers/{user_id}/feed"),
    ("post", "/v1/subscribers/{user_id}/seen"),
    ("post", "/v1/subscribers/{user_id}/read"),
    ("post", "/v1/subscribers/{user_id}/feed-token"),
    ("options", "/v1/feed"),
    ("options", "/v1/feed/seen"),
    ("options", "/v1/feed/read"),
    ("options", "/v1/feed/stream"),
    ("get", "/v1/feed"),
    ("post", "/v1/feed/seen"),
    ("post", "/v1/feed/read"),
    ("post", "/v1/newsletters"),
    ("post", "/v1/newsletters/{newsletter_id}/test"),
    ("post", "/v1/newsletters/{newsletter_id}/send"),
    ("post", "/v1/newsletters/{newsletter_id}/pause"),
    ("post", "/v1/newsletters/{newsletter_id}/resume"),
    ("get", "/v1/newsletters/{newsletter_id}"),
    ("get", "/v1/newsletters"),
    ("post", "/v1/newsletters/{newsletter_id}/retry-failed"),
    ("post", "/v1/newsletters/{newsletter_id}/cancel"),
    ("get", "/c/{code}"),
    ("get", "/o/{code}.gif"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("post", "/webhooks/sendgrid"),
    ("delete", "/v1/categories/{key}"),
    ("delete", "/v1/subscribers/{user_id}"),
]
# Shown, not called here: an endless stream (tests/web/test_feed_browser.py reads it), and the webhooks
# of the providers whose deliveries carry a fresh signature or credentials: their tests sign each
# example with a key of their own and post it (tests/tracking/test_webhook_{ses,postmark,mailgun}.py).
NOT_CALLED = {
    ("get", "/v1/feed/stream"),
    ("post", "/webhooks/ses"),
    ("post", "/webhooks/postmark"),
    ("post", "/webhooks/mailgun"),
}
EVENTS_SCOPE = {"/v1/events", "/v1/subscribers/{user_id}/seen", "/v1/subscribers/{user_id}/read"}
ORIGIN = "http://127.0.0.1:8026"


def document() -> dict:
    return openapi.build(app.routes)


def each_operation(doc: dict):
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            yield method, path, op


def test_every_operation_shows_a_call_and_its_answer():
    missing = []
    for method, path, op in each_operation(document()):
        where = f"{method.upper()} {path}"
        parameters = op.get("parameters", [])
        missing += [f"{where}: parameter {p['name']}" for p in parameters if p["required"] and "example" not in p]
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            if "example" not in content:
                missing.append(f"{where}: request {media}")
        successes = {status: r for status, r in op["responses"].items() if status[0] in "23"}
        for status, response in successes.items():
            for media, content in response.get("content", {}).items():
                if "example" not in content:
                    missing.append(f"{where}: answer {status} {media}")
        # 202 and 204 without a body: the status is the whole answer
        shown = [s for s, r in successes.items() if r.get("content") or r.get("headers") or s in ("202", "204")]
        if not shown:
            missing.append(f"{where}: no answer shown")
        assert op.get("summary"), where
    assert missing == []


def _models(answer: Any) -> tuple[type[BaseModel], ...]:
    return (answer[1],) if isinstance(answer, tuple) else ()


def test_examples_pass_the_models_that_validate_calls_and_answers():
    checked = 0
    for path, methods in openapi.operations(app.routes).items():
        for method, op in methods.items():
            example = op.example
            assert example is not None, (method, path)
            if op.body is not None and op.check is None:
                bodies = op.body if isinstance(op.body, tuple) else (op.body,)
                assert any(_accepts(m, example.request) for m in bodies), (method, path)
                checked += 1
            for status, body in example.answers.items():
                for model in _models(op.responses[status]):
                    model.model_validate(body)
                    checked += 1
    assert checked >= 20


def _accepts(model: type[BaseModel], value: Any) -> bool:
    try:
        model.model_validate(value)
    except ValueError:
        return False
    return True


def shape(value: Any) -> Any:
    """What the comparison keeps of a JSON value: keys, and the JSON type of each leaf."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None if value is None else "number" if isinstance(value, int | float) else type(value).__name__


def same_shape(real: Any, shown: Any, where: str) -> list[str]:
    if isinstance(real, dict) and isinstance(shown, dict):
        if set(real) != set(shown):
            return [f"{where}: keys {sorted(set(real) ^ set(shown))} differ"]
        return [p for k in real for p in same_shape(real[k], shown[k], f"{where}.{k}")]
    if isinstance(real, list) and isinstance(shown, list):
        return same_shape(real[0], shown[0], f"{where}[0]") if real and shown else []
    if None in (real, shown) or shape(real) == shape(shown):
        return []
    return [f"{where}: {real!r} is shown as {shown!r}"]


@pytest.fixture
def made(client, admin_key, events_key, settings, tmp_path):
    settings(feed_allowed_origins=(ORIGIN,), mail_provider="file", mail_file_dir=str(tmp_path))
    return {"admin": admin_key, "events": events_key}


def test_every_example_is_what_the_api_answers(client, made):
    doc = document()
    ops = {(m, p): op for m, p, op in each_operation(doc)}
    assert set(CALLS) | NOT_CALLED == set(ops)
    found: dict[str, Any] = {}
    problems: list[str] = []
    for method, path in CALLS:
        op = ops[(method, path)]
        shown_params = [p for p in op.get("parameters", []) if "example" in p]
        params = {p["name"]: p["example"] for p in shown_params}
        query = {p["name"]: p["example"] for p in shown_params if p["in"] == "query"}
        if "newsletter_id" in params:
            params["newsletter_id"] = found["newsletter_id"]
        if path == "/c/{code}":
            link = links.ensure_links("newsletter", found["newsletter_id"], ["https://example.test/posts/p1"])
            params["code"] = codes.click_code(next(iter(link.values())), found["subscriber_id"])
        if path == "/o/{code}.gif":
            params["code"] = codes.open_code("newsletter", found["newsletter_id"], found["subscriber_id"])
        url = path.format(**params)
        headers = {}
        if path.startswith("/v1/feed"):
            headers = {"Authorization": f"Bearer {found['feed_token']}", "Origin": ORIGIN}
            if method == "options":
                headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        elif path in EVENTS_SCOPE:
            headers = auth(made["events"])
        elif path.startswith("/v1/") or path == "/metrics":
            headers = auth(made["admin"])
        content = None
        body = op.get("requestBody", {}).get("content", {})
        if body:
            media, shown = next(iter(body.items()))
            headers["Content-Type"] = media
            content = json.dumps(shown["example"])
        answer = client.request(
            method.upper(), url, params=query, headers=headers, content=content, follow_redirects=False
        )
        where = f"{method.upper()} {path}"
        response = op["responses"].get(str(answer.status_code))
        if response is None or not (
            response.get("content") or response.get("headers") or answer.status_code in (202, 204)
        ):
            problems.append(f"{where}: answered {answer.status_code}, which has no example ({answer.text[:200]})")
            continue
        for media, shown in response.get("content", {}).items():
            if media == "application/json":
                problems += same_shape(answer.json(), shown["example"], where)
            else:
                assert answer.headers["content-type"].startswith(media.split(";")[0]), where
        for name in response.get("headers", {}):
            if name not in answer.headers:
                problems.append(f"{where}: no {name} header")
        if path == "/v1/subscribers/{user_id}" and method == "put":
            found["subscriber_id"] = answer.json()["id"]
        if path == "/v1/newsletters" and method == "post":
            found["newsletter_id"] = answer.json()["id"]
        if path.endswith("/feed-token"):
            found["feed_token"] = answer.json()["token"]
    assert problems == []
