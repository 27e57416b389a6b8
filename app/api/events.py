"""POST /v1/events: one event or a batch of up to 1000, all-or-nothing, 202 only once committed."""
from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.routing import Route

from app import ingest
from app.http import ApiError, FastJSONResponse, read_json, require_key, validation_error

log = logging.getLogger("app.api.events")


async def post_events(request: Request):
    principal = await require_key(request, "events")
    body = await read_json(request)
    try:
        events, is_batch = ingest.events_from_body(body)
    except ingest.BatchShapeError as exc:
        raise validation_error([{"field": exc.field, "message": exc.message}]) from None
    rows, errors = ingest.validate_batch(events, is_batch, principal.name)
    if errors:
        raise validation_error(errors)
    try:
        result = await asyncio.wrap_future(ingest.submit(rows))
    except Exception as exc:
        log.error("events from %s not stored: %s", principal.name, exc)
        raise ApiError(503, "unavailable", "events could not be stored; nothing was committed, retry later",
                       headers={"Retry-After": "5"}) from None
    return FastJSONResponse({"accepted": result.accepted, "duplicates": result.duplicates}, status_code=202)


routes = [Route("/v1/events", post_events, methods=["POST"])]

def _text(max_len: int, required: bool = False, description: str | None = None) -> dict:
    """Mirror of ingest.validate_event's string rules, so generated clients and fuzzers agree."""
    schema = {"type": "string", "maxLength": max_len, "pattern": "^[^\\u0000]*$"}
    if required:
        schema.update(minLength=1, pattern="^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$")
    else:
        schema["nullable"] = True  # null means absent
    if description:
        schema["description"] = description
    return schema


_event_schema = {
    "type": "object",
    "required": ["id", "user_id", "category", "entity_type", "entity_id"],
    "additionalProperties": False,
    "properties": {
        "id": _text(200, True, "producer's idempotency key"),
        "user_id": _text(200, True),
        "category": _text(100, True),
        "entity_type": _text(100, True),
        "entity_id": _text(200, True),
        "actor_id": _text(200),
        "actor_name": _text(200),
        "payload": {"type": "object", "nullable": True, "description": "at most 16 KiB as JSON"},
        "occurred_at": {"type": "string", "format": "date-time", "nullable": True,
                        "description": "RFC 3339 with offset; default: now"},
    },
}

OPENAPI_SCHEMAS = {"Event": _event_schema}
OPENAPI_PATHS = {
    "/v1/events": {
        "post": {
            "summary": "Ingest one event or a batch of up to 1000 (all-or-nothing)",
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
                {"$ref": "#/components/schemas/Event"},
                {"type": "object", "required": ["events"], "additionalProperties": False,
                 "properties": {"events": {"type": "array", "minItems": 1, "maxItems": 1000,
                                           "items": {"$ref": "#/components/schemas/Event"}}}},
            ]}}}},
            "responses": {
                "202": {"description": "committed", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"accepted": {"type": "integer"},
                                                     "duplicates": {"type": "integer"}}}}}},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "413": {"$ref": "#/components/responses/Error"},
                "422": {"$ref": "#/components/responses/Error"},
                "503": {"$ref": "#/components/responses/Error"},
            },
        }
    }
}
