"""POST /v1/events: one event or a batch of up to 1000, all-or-nothing, 202 only once committed."""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel
from starlette.requests import Request

from app.platform import metrics
from app.platform.errors import Unavailable
from app.platform.openapi import Example, Operation, api_route
from digest import ingest

log = logging.getLogger("app.web.api.events")


def rows_of(request: Request, body) -> tuple[list[tuple], list[dict]]:
    """The body's rows for digest_events, from the key the route checked (scope "events"), or the
    problems (each refused event counted)."""
    rows, errors = ingest.validate_body(body, request.state.principal.name)
    if errors:
        batch = body.get("events") if isinstance(body, dict) else None
        metrics.EVENTS.labels("rejected").inc(len(batch) if isinstance(batch, list) else 1)
    return rows, errors


async def post_events(request: Request, body: list[tuple]) -> ingest.Result:
    try:
        result = await asyncio.wrap_future(ingest.submit(body))
    except Exception as exc:
        log.error("events from %s not stored: %s", request.state.principal.name, exc)
        raise Unavailable("events could not be stored; nothing was committed, retry later", retry_after=5) from None
    metrics.EVENTS.labels("accepted").inc(result.accepted)
    metrics.EVENTS.labels("duplicate").inc(result.duplicates)
    return result  # answered as EventsAccepted


class EventsAccepted(BaseModel):
    accepted: int
    duplicates: int


# The reference's example: the quick start's two events (README).
_EVENTS = {
    "events": [
        {
            "id": id_,
            "user_id": "you",
            "category": "cheer",
            "entity_type": "post",
            "entity_id": "p1",
            "actor_name": actor,
            "entity_title": "Launch notes",
        }
        for id_, actor in (("e1", "Bo"), ("e2", "Cy"))
    ]
}

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
            check=rows_of,
            example=Example(request=_EVENTS, answers={202: {"accepted": 2, "duplicates": 0}}),
        ),
    )
]
