"""Property-based API fuzzing from our own OpenAPI document (schemathesis): no input makes the
public API answer 5xx or break its documented response contract."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, settings

from app.platform import apikeys
from app.web import app

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture
def bearer():
    return {"Authorization": f"Bearer {apikeys.create('fuzz', 'admin')}"}


def _in_the_future(text: str) -> bool:
    try:
        when = datetime.fromisoformat(text.upper().replace(" ", "T").replace("Z", "+00:00"))
    except ValueError:
        return False
    return when.tzinfo is not None and when > datetime.now(UTC)


@schema.include(path_regex="^/v1/").parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_contract_holds_for_generated_input(case, bearer):
    # jsonb cannot hold U+0000; such payloads get a documented 422 (tested in test_api_events),
    # which OpenAPI has no way to express for a free-form object. (Integers past 64 bits it can:
    # the payload's values are #/components/schemas/JsonValue.)
    if isinstance(case.body, (dict, list)):
        assume("\\u0000" not in json.dumps(case.body))
    # A newsletter's send_at must be in the future (a documented 422 otherwise, tested in
    # test_newsletter_schedule): OpenAPI has no way to express "after now".
    if isinstance(case.body, dict) and isinstance(case.body.get("send_at"), str):
        assume(_in_the_future(case.body["send_at"]))
    # Quiet hours must start and end at different times (a documented 422 otherwise, tested in
    # tests/web/test_api_subscribers_patch.py): JSON Schema cannot say two fields differ.
    if isinstance(case.body, dict) and isinstance(case.body.get("quiet_hours"), dict):
        window = case.body["quiet_hours"]
        assume(window.get("start") != window.get("end"))
    case.call_and_validate(headers=bearer)
