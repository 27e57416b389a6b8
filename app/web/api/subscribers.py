"""Admin API for subscribers: PUT (create or replace), GET, DELETE (right to erasure)."""

from __future__ import annotations

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.newsletter import rows as newsletter_rows
from app.platform.http import ApiError, FastJSONResponse, read_put_body, validation_error
from app.platform.openapi import Operation, api_route
from app.platform.validation import Text, check
from app.subscribers import records as subscribers

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


async def get_subscriber(request: Request):
    record = await run_in_threadpool(subscribers.get, _user_id(request))
    if record is None:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return FastJSONResponse(record)


async def delete_subscriber(request: Request):
    erased = await run_in_threadpool(subscribers.erase, _user_id(request), (newsletter_rows.ERASE_FROM_AUDIENCES,))
    if not erased:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return Response(status_code=204)


_BY_METHOD = {"GET": get_subscriber, "HEAD": get_subscriber, "PUT": put_subscriber, "DELETE": delete_subscriber}


async def subscriber(request: Request):
    # One route for the three methods, so a 405 carries the full Allow header.
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
