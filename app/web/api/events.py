"""POST /v1/events: one event or a batch of up to 1000, all-or-nothing, 202 only once committed."""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel
from starlette.requests import Request

from app.platform import metrics
from app.platform.http import ApiError, FastJSONResponse, read_json, validation_error
from app.platform.openapi import Operation, api_route
from digest import ingest

log = logging.getLogger("app.web.api.events")


async def post_events(request: Request):
    principal = request.state.principal  # the key the route checked (scope "events", declared below)
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


class EventsAccepted(BaseModel):
    accepted: int
    duplicates: int


routes = [
    api_route(
        "/v1/events",
        post_events,
        post=Operation(
            "Ingest one event or a batch of up to 1000 (all-or-nothing)",
            {202: ("committed", EventsAccepted)},
            errors=(400, 413, 422, 503),
            body=(ingest.Event, ingest.EventBatch),
            scope="events",
        ),
    )
]
