"""The OpenAPI document, pinned: /openapi.json is compared with tests/fixtures/openapi.json, so a change
to the route declarations (app/platform/openapi.py `api_route`) that moves the document is seen and
made on purpose. After a deliberate change, write the snapshot again and commit it with the change:

    UPDATE_OPENAPI_SNAPSHOT=1 .venv/bin/python -m pytest tests/web/test_openapi_snapshot.py
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import pytest

from app.platform import openapi

SNAPSHOT = Path(__file__).parents[1] / "fixtures" / "openapi.json"


def _text(document) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_the_document_is_the_snapshot(client):
    live = _text(client.get("/openapi.json").json())
    if os.environ.get("UPDATE_OPENAPI_SNAPSHOT") == "1":
        SNAPSHOT.write_text(live, encoding="utf-8")
    pinned = SNAPSHOT.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(pinned.splitlines(True), live.splitlines(True), "snapshot", "live", n=2))
    assert not diff, f"/openapi.json moved from {SNAPSHOT.name} (see the module's docstring):\n{diff[:20000]}"


def test_the_reference_is_grouped_by_purpose_public_api_first(client):
    """/docs groups operations by tag: each has one of the declared tags, each tag says what it is
    for and has operations, and the paths come in the tags' order (events first, tracking and health
    last), not alphabetically (which put /c/{code} and /healthz before the API)."""
    from app.web import API_TAGS

    document = client.get("/openapi.json").json()
    names = [tag.name for tag in API_TAGS]
    assert names == [
        "events",
        "subscribers",
        "categories",
        "feed",
        "newsletters",
        "webhooks",
        "tracking",
        "operations",
    ]
    assert [t["name"] for t in document["tags"]] == names
    assert all(t["description"] for t in document["tags"])
    order = []
    for path, ops in document["paths"].items():
        tags = {tuple(op["tags"]) for op in ops.values()}
        assert len(tags) == 1 and len(next(iter(tags))) == 1, f"{path}: {tags}"
        order.append(names.index(next(iter(tags))[0]))
    assert order == sorted(order), "paths are not in the tags' order"
    assert set(order) == set(range(len(names))), "a tag with no operation"
    first, *_, last = document["paths"]
    assert first == "/v1/events" and last in ("/healthz", "/metrics")
    grouped = {path: ops[next(iter(ops))]["tags"][0] for path, ops in document["paths"].items()}
    assert grouped["/v1/subscribers/{user_id}/feed"] == "feed" and grouped["/v1/subscribers/{user_id}"] == "subscribers"
    assert grouped["/c/{code}"] == grouped["/o/{code}.gif"] == "tracking"


def test_a_path_no_tag_claims_is_a_declaration_error():

    tags = (openapi.Tag("api", "the API", ("/v1",)),)
    assert openapi.tag_of("/v1/events", tags).name == "api"
    with pytest.raises(ValueError, match="no OpenAPI tag claims /v10/x"):
        openapi.tag_of("/v10/x", tags)
