"""Admin API for subscribers: PUT (create or replace), PATCH (a JSON merge patch), GET, DELETE (right to
erasure)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.operations.audit import Operator
from app.operations.erasure import erase_subscriber
from app.platform.errors import NotFound
from app.platform.http import FastJSONResponse
from app.platform.openapi import Example, Operation, api_route
from app.platform.validation import Text
from app.subscribers import records
from tracking.machines import client_ip

# What Postgres text can hold (no U+0000), declared once for the check and the OpenAPI document.
_USER_ID = TypeAdapter(Text(200, min_length=1))


async def put_subscriber(request: Request, user_id: str, body: records.SubscriberInput):
    record, created = await run_in_threadpool(records.upsert, user_id, body.model_dump())
    return FastJSONResponse(record, status_code=201 if created else 200)


PATCH_TYPES = ("application/merge-patch+json", "application/json")
BODY_LIMIT = 64 * 1024


def _merge_patch(request: Request, data) -> tuple[dict, list[dict]]:
    return records.validate_merge_patch(data)


async def patch_subscriber(request: Request, user_id: str, body: dict):
    record = await run_in_threadpool(records.patch, user_id, body)
    if record is None:
        raise NotFound("no subscriber with that user_id; PUT creates one")
    return FastJSONResponse(record)


async def get_subscriber(request: Request, user_id: str):
    record = await run_in_threadpool(records.get, user_id)
    if record is None:
        raise NotFound("no subscriber with that user_id")
    return FastJSONResponse(record)


async def delete_subscriber(request: Request, user_id: str):
    key = request.state.principal
    peer = request.client.host if request.client else None
    operator = Operator(key.name, key.key_id, client_ip(request.headers.get("x-forwarded-for"), peer))
    if not await run_in_threadpool(erase_subscriber, user_id, operator):
        raise NotFound("no subscriber with that user_id")
    return Response(status_code=204)


# The reference's examples: the quick start's subscriber (README), as PUT makes it and PATCH changes it.
_INPUT = {
    "email": "you@example.test",
    "name": "You",
    "timezone": "Europe/Lisbon",
    "quiet_hours": {"start": "22:00", "end": "07:00"},
}
_RECORD = {
    "id": 1,
    "user_id": "you",
    "email": "you@example.test",
    "name": "You",
    "timezone": "Europe/Lisbon",
    "digest_cadence": "daily",
    "digest_hour": 9,
    "digest_weekday": 0,
    "category_opt_outs": [],
    "tracking_opt_out": False,
    "locale": None,
    "quiet_hours": {"start": "22:00", "end": "07:00"},
    "max_mails_per_day": None,
    "paused_until": None,
    "unsubscribed_at": None,
    "created_at": "2026-11-28T09:00:00+00:00",
    "updated_at": "2026-11-28T09:00:00+00:00",
    "digest_weekday_name": "monday",
    "held_until": None,
}
_PATCHED = {**_RECORD, "name": "Sam", "digest_hour": 8, "updated_at": "2026-11-28T09:05:00+00:00"}
_YOU = {"user_id": "you"}


_BY_METHOD: dict[str, Callable[..., Awaitable[Response]]] = {
    "GET": get_subscriber,
    "HEAD": get_subscriber,
    "PUT": put_subscriber,
    "PATCH": patch_subscriber,
    "DELETE": delete_subscriber,
}


async def subscriber(request: Request, **declared):
    # One route for every method, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request, **declared)


routes = [
    api_route(
        "/v1/subscribers/{user_id:str}",
        subscriber,
        path_params={"user_id": _USER_ID},
        put=Operation(
            "Create or replace a subscriber",
            {200: "replaced", 201: "created"},
            errors=(400, 422),
            body=records.SubscriberInput,
            scope="admin",
            body_limit=BODY_LIMIT,
            echo="user_id",
            example=Example(_YOU, _INPUT, {201: _RECORD, 200: _RECORD}),
        ),
        patch=Operation(
            "Change some fields of a subscriber (JSON merge patch, RFC 7396)",
            {200: "the subscriber after the patch"},
            errors=(400, 404, 415, 422),
            body=records.SubscriberPatch,
            scope="admin",
            description="Only the fields named change; null sets an optional field back to its default "
            "(name '', timezone UTC, cadence daily, hour 9, weekday 0, no opt-outs, tracking on) and is a 422 for "
            "email. Validation and the schedule change (pending digest runs replanned) are PUT's. Two patches of "
            "different fields at once both land (one UPDATE of the named columns).",
            media_types=PATCH_TYPES,
            body_limit=BODY_LIMIT,
            echo="user_id",
            check=_merge_patch,
            example=Example(_YOU, {"name": "Sam", "digest_hour": 8}, {200: _PATCHED}),
        ),
        get=Operation(
            "Read a subscriber",
            {200: "the subscriber"},
            errors=(404, 422),
            scope="admin",
            example=Example(_YOU, answers={200: _PATCHED}),
        ),
        delete=Operation(
            "Erase a subscriber (right to erasure): their events, runs, outbox rows, webhook events and "
            "digest links are deleted, click/open history anonymised, the address suppressed",
            {204: "erased"},
            errors=(404, 422),
            scope="admin",
            example=Example(_YOU),
        ),
    )
]
