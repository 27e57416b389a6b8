"""The in-app feed's API: the feed of a subscriber, and seen/read marks from the product (server side)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform.http import ApiError, FastJSONResponse, field_error, read_json, require_key, validation_error
from app.platform.validation import Text, check, plain_int
from digest import feed, seen

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
    if errors or mark is None:
        raise validation_error(errors)
    if not await run_in_threadpool(seen.mark_user, user_id, kind, mark):
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return _accepted()


async def post_seen(request: Request):
    return await _mark(request, seen.SEEN)


async def post_read(request: Request):
    return await _mark(request, seen.READ)


def feed_query(request: Request) -> dict:
    """`limit`, `unread`, `before` of a feed request; 422 naming each bad one."""
    params, errors = request.query_params, []
    out: dict[str, Any] = {}
    unknown = sorted(set(params) - {"limit", "unread", "before"})
    errors += [field_error(name, "unknown query parameter") for name in unknown]
    if "limit" in params:
        limit = plain_int(params["limit"], 3)
        if limit is None or not 1 <= limit <= feed.MAX_LIMIT:
            errors.append(field_error("limit", f"must be an integer from 1 to {feed.MAX_LIMIT}"))
        out["limit"] = limit
    if "unread" in params:
        if params["unread"] not in ("true", "false"):
            errors.append(field_error("unread", "must be true or false"))
        out["unread_only"] = params["unread"] == "true"
    if "before" in params:
        try:
            out["before"] = feed.parse_cursor(params["before"])
        except feed.BadCursor as exc:
            errors.append(field_error("before", str(exc)))
    if errors:
        raise validation_error(errors)
    return out


async def get_feed(request: Request):
    await require_key(request, "admin")
    user_id, query = user_id_param(request), feed_query(request)
    subscriber = await run_in_threadpool(feed.find, user_id)
    if subscriber is None:
        raise ApiError(404, "not_found", "no subscriber with that user_id")
    return FastJSONResponse(await run_in_threadpool(lambda: feed.page(subscriber, **query)))


routes = [
    Route("/v1/subscribers/{user_id:str}/feed", get_feed, methods=["GET"]),
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
_feed_params = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": feed.MAX_LIMIT}},
    {"name": "unread", "in": "query", "schema": {"type": "string", "enum": ["true", "false"]}},
    {
        "name": "before",
        "in": "query",
        "schema": {"type": "string", "pattern": feed.CURSOR_PATTERN},
        "description": "next_before of the previous page",
    },
]
FEED_RESPONSE = {
    "description": "one item per entity, newest activity first, worded as the digest words it",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "unseen_count": {"type": "integer"},
                    "unread_count": {"type": "integer"},
                    "items": {"type": "array", "items": {"type": "object"}},
                    "next_before": {"type": ["string", "null"]},
                },
            }
        }
    },
}
OPENAPI_PATHS = {
    "/v1/subscribers/{user_id}/feed": {
        "get": {
            "summary": "A subscriber's in-app feed",
            "security": [{"bearer": []}],
            "parameters": _user_param + _feed_params,
            "responses": {"200": FEED_RESPONSE, "401": _err, "403": _err, "404": _err, "422": _err},
        }
    },
    "/v1/subscribers/{user_id}/seen": _mark_doc("seen"),
    "/v1/subscribers/{user_id}/read": _mark_doc("read"),
}
