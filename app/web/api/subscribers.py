"""Admin API for subscribers: PUT (create or replace), PATCH (a JSON merge patch), GET, DELETE (right to
erasure)."""

from __future__ import annotations

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.operations.audit import Operator
from app.operations.erasure import erase_subscriber
from app.platform.http import ApiError, FastJSONResponse, read_json, read_put_body, validation_error
from app.platform.openapi import Operation, api_route
from app.platform.validation import Text, check
from app.subscribers import records as subscribers
from tracking.machines import client_ip

# What Postgres text can hold (no U+0000), declared once for the check and the OpenAPI document.
_USER_ID = TypeAdapter(Text(200, min_length=1))


def _user_id(request: Request) -> str:
    user_id, errors = check(_USER_ID, request.path_params["user_id"], root="user_id")
    if errors:
        raise validation_error(errors)
    return user_id


async def put_subscriber(request: Request):
    user_id = _user_id(request)
    values = await read_put_body(request, "user_id", user_id, subscribers.validate, 64 * 1024)
    record, created = await run_in_threadpool(subscribers.upsert, user_id, values)
    return FastJSONResponse(record, status_code=201 if created else 200)


PATCH_TYPES = ("application/merge-patch+json", "application/json")
BODY_LIMIT = 64 * 1024


async def patch_subscriber(request: Request):
    user_id = _user_id(request)
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type not in PATCH_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the patch as {' or '.join(PATCH_TYPES)} (a JSON merge patch, RFC 7396)",
            headers={"Accept-Patch": ", ".join(PATCH_TYPES)},
        )
    body = await read_json(request, limit=BODY_LIMIT)
    echoed = body.pop("user_id", None) if isinstance(body, dict) else None
    values, errors = subscribers.validate_merge_patch(body)
    if echoed not in (None, user_id):
        errors.append({"field": "user_id", "message": "does not match the URL"})
    if errors:
        raise validation_error(errors)
    record = await run_in_threadpool(subscribers.patch, user_id, values)
    if record is None:
        raise ApiError(404, "not_found", "no subscriber with that user_id; PUT creates one")
    return FastJSONResponse(record)


async def get_subscriber(request: Request):
    record = await run_in_threadpool(subscribers.get, _user_id(request))
    if record is None:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return FastJSONResponse(record)


async def delete_subscriber(request: Request):
    key = request.state.principal
    peer = request.client.host if request.client else None
    operator = Operator(key.name, key.key_id, client_ip(request.headers.get("x-forwarded-for"), peer))
    erased = await run_in_threadpool(erase_subscriber, _user_id(request), operator)
    if not erased:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return Response(status_code=204)


_BY_METHOD = {
    "GET": get_subscriber,
    "HEAD": get_subscriber,
    "PUT": put_subscriber,
    "PATCH": patch_subscriber,
    "DELETE": delete_subscriber,
}


async def subscriber(request: Request):
    # One route for every method, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request)


routes = [
    api_route(
        "/v1/subscribers/{user_id:str}",
        subscriber,
        path_params={"user_id": _USER_ID},
        put=Operation(
            "Create or replace a subscriber",
            {200: "replaced", 201: "created"},
            errors=(400, 422),
            body=subscribers.SubscriberInput,
            scope="admin",
        ),
        patch=Operation(
            "Change some fields of a subscriber (JSON merge patch, RFC 7396)",
            {200: "the subscriber after the patch"},
            errors=(400, 404, 415, 422),
            body=subscribers.SubscriberPatch,
            scope="admin",
            description="Only the fields named change; null sets an optional field back to its default "
            "(name '', timezone UTC, cadence daily, hour 9, weekday 0, no opt-outs, tracking on) and is a 422 for "
            "email. Validation and the schedule change (pending digest runs replanned) are PUT's. Two patches of "
            "different fields at once both land (one UPDATE of the named columns).",
            media_types=PATCH_TYPES,
        ),
        get=Operation("Read a subscriber", {200: "the subscriber"}, errors=(404, 422), scope="admin"),
        delete=Operation(
            "Erase a subscriber (right to erasure): their events, runs, outbox rows, webhook events and "
            "digest links are deleted, click/open history anonymised, the address suppressed",
            {204: "erased"},
            errors=(404, 422),
            scope="admin",
        ),
    )
]
