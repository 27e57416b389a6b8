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
