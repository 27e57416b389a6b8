"""The in-app feed's API: seen/read marks from the product (server side)."""

from __future__ import annotations

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform.http import ApiError, read_json, require_key, validation_error
from app.platform.validation import Text, check
from digest import seen

_USER_ID = TypeAdapter(Text(200, min_length=1))  # as app/web/api/subscribers.py declares it


def user_id_param(request: Request) -> str:
    user_id, errors = check(_USER_ID, request.path_params["user_id"], root="user_id")
    if errors:
        raise validation_error(errors)
    return user_id


def _accepted() -> Response:
    return Response(status_code=202)


async def _mark(request: Request, kind: str) -> Response:
    await require_key(request, "events")
    user_id = user_id_param(request)
    mark, errors = seen.validate_mark(await read_json(request))
    if errors:
        raise validation_error(errors)
    if not await run_in_threadpool(seen.mark_user, user_id, kind, mark):
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return _accepted()


async def post_seen(request: Request):
    return await _mark(request, seen.SEEN)


async def post_read(request: Request):
    return await _mark(request, seen.READ)


routes = [
    Route("/v1/subscribers/{user_id:str}/seen", post_seen, methods=["POST"]),
    Route("/v1/subscribers/{user_id:str}/read", post_read, methods=["POST"]),
]

_err = {"$ref": "#/components/responses/Error"}
_user_param = [{"name": "user_id", "in": "path", "required": True, "schema": _USER_ID.json_schema()}]


def _mark_doc(kind: str) -> dict:
    return {
        "post": {
            "summary": f"Mark entities (or everything) {kind} for a subscriber",
            "security": [{"bearer": []}],
            "parameters": _user_param,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/MarkInput"}}},
            },
            "responses": {
                "202": {"description": "committed"},
                "400": _err,
                "401": _err,
                "403": _err,
                "404": _err,
                "413": _err,
                "422": _err,
            },
        }
    }


OPENAPI_MODELS = [seen.MarkInput]
OPENAPI_PATHS = {
    "/v1/subscribers/{user_id}/seen": _mark_doc("seen"),
    "/v1/subscribers/{user_id}/read": _mark_doc("read"),
}
