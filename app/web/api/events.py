"""POST /v1/events: one event or a batch of up to 1000, all-or-nothing, 202 only once committed."""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.routing import Route

from app.platform import metrics
from app.platform.http import ApiError, FastJSONResponse, read_json, require_key, validation_error
from digest import ingest

log = logging.getLogger("app.web.api.events")


async def post_events(request: Request):
    principal = await require_key(request, "events")
    body = await read_json(request)
    rows, errors = ingest.validate_body(body, principal.name)
    if errors:
        batch = body.get("events") if isinstance(body, dict) else None
        metrics.EVENTS.labels("rejected").inc(len(batch) if isinstance(batch, list) else 1)
        raise validation_error(errors)
    try:
        result = await asyncio.wrap_future(ingest.submit(rows))
    except Exception as exc:
        log.error("events from %s not stored: %s", principal.name, exc)
        raise ApiError(
            503,
            "unavailable",
            "events could not be stored; nothing was committed, retry later",
            headers={"Retry-After": "5"},
        ) from None
    metrics.EVENTS.labels("accepted").inc(result.accepted)
    metrics.EVENTS.labels("duplicate").inc(result.duplicates)
    return FastJSONResponse({"accepted": result.accepted, "duplicates": result.duplicates}, status_code=202)


routes = [Route("/v1/events", post_events, methods=["POST"])]

OPENAPI_MODELS = [ingest.Event, ingest.EventBatch]
OPENAPI_PATHS = {
    "/v1/events": {
        "post": {
            "summary": "Ingest one event or a batch of up to 1000 (all-or-nothing)",
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "oneOf": [
                                {"$ref": "#/components/schemas/Event"},
                                {"$ref": "#/components/schemas/EventBatch"},
                            ]
                        }
                    }
                },
            },
            "responses": {
                "202": {
                    "description": "committed",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"accepted": {"type": "integer"}, "duplicates": {"type": "integer"}},
                            }
                        }
                    },
                },
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "413": {"$ref": "#/components/responses/Error"},
                "422": {"$ref": "#/components/responses/Error"},
                "503": {"$ref": "#/components/responses/Error"},
            },
        }
    }
}
