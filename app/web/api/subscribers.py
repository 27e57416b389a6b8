"""Admin API for subscribers: PUT (create or replace), GET, DELETE (right to erasure)."""

from __future__ import annotations

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.newsletter import rows as newsletter_rows
from app.platform.http import ApiError, FastJSONResponse, read_put_body, require_key, validation_error
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
    await require_key(request, "admin")
    user_id = _user_id(request)
    values = await read_put_body(request, "user_id", user_id, subscribers.validate, 64 * 1024)
    record, created = await run_in_threadpool(subscribers.upsert, user_id, values)
    return FastJSONResponse(record, status_code=201 if created else 200)


async def get_subscriber(request: Request):
    await require_key(request, "admin")
    record = await run_in_threadpool(subscribers.get, _user_id(request))
    if record is None:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return FastJSONResponse(record)


async def delete_subscriber(request: Request):
    await require_key(request, "admin")
    erased = await run_in_threadpool(subscribers.erase, _user_id(request), (newsletter_rows.ERASE_FROM_AUDIENCES,))
    if not erased:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return Response(status_code=204)


_BY_METHOD = {"GET": get_subscriber, "HEAD": get_subscriber, "PUT": put_subscriber, "DELETE": delete_subscriber}


async def subscriber(request: Request):
    # One route for the three methods, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request)


routes = [Route("/v1/subscribers/{user_id:str}", subscriber, methods=["GET", "PUT", "DELETE"])]

_user_param = [{"name": "user_id", "in": "path", "required": True, "schema": _USER_ID.json_schema()}]
_err = {"$ref": "#/components/responses/Error"}

OPENAPI_MODELS = [subscribers.SubscriberInput]
OPENAPI_PATHS = {
    "/v1/subscribers/{user_id}": {
        "put": {
            "summary": "Create or replace a subscriber",
            "security": [{"bearer": []}],
            "parameters": _user_param,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SubscriberInput"}}},
            },
            "responses": {
                "200": {"description": "replaced"},
                "201": {"description": "created"},
                "400": _err,
                "401": _err,
                "403": _err,
                "422": _err,
            },
        },
        "get": {
            "summary": "Read a subscriber",
            "security": [{"bearer": []}],
            "parameters": _user_param,
            "responses": {"200": {"description": "the subscriber"}, "401": _err, "403": _err, "404": _err, "422": _err},
        },
        "delete": {
            "summary": "Erase a subscriber (right to erasure): their events, runs, outbox rows, webhook events and "
            "digest links are deleted, click/open history anonymised, the address suppressed",
            "security": [{"bearer": []}],
            "parameters": _user_param,
            "responses": {"204": {"description": "erased"}, "401": _err, "403": _err, "404": _err, "422": _err},
        },
    }
}
