"""Admin API for the category registry (app/subscribers/categories.py): PUT (create or replace), GET, DELETE
one category; GET the list."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform.http import ApiError, FastJSONResponse, read_put_body, require_key, validation_error
from app.subscribers import categories

BODY_LIMIT = 16 * 1024  # the largest valid body (label, description, verb at 12 bytes a character) fits


def _key(request: Request) -> str:
    key = request.path_params["key"]
    if not categories.valid_key(key):
        raise validation_error([{"field": "key", "message": categories.KEY_RULE}])
    return key


async def put_category(request: Request):
    await require_key(request, "admin")
    key = _key(request)
    values = await read_put_body(request, "key", key, categories.validate, BODY_LIMIT)
    record, created = await run_in_threadpool(categories.upsert, key, values)
    return FastJSONResponse(record, status_code=201 if created else 200)


async def get_category(request: Request):
    await require_key(request, "admin")
    record = await run_in_threadpool(categories.get, _key(request))
    if record is None:
        raise ApiError(404, "not_found", "no category with that key")
    return FastJSONResponse(record)


async def delete_category(request: Request):
    await require_key(request, "admin")
    if not await run_in_threadpool(categories.delete, _key(request)):
        raise ApiError(404, "not_found", "no category with that key")
    return Response(status_code=204)


async def list_categories(request: Request):
    await require_key(request, "admin")
    return FastJSONResponse({"categories": await run_in_threadpool(categories.list_all)})


_BY_METHOD = {"GET": get_category, "HEAD": get_category, "PUT": put_category, "DELETE": delete_category}


async def category(request: Request):
    # One route for the three methods, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request)


routes = [
    Route("/v1/categories", list_categories, methods=["GET"]),
    Route("/v1/categories/{key:str}", category, methods=["GET", "PUT", "DELETE"]),
]

_err = {"$ref": "#/components/responses/Error"}
_key_param = [
    {
        "name": "key",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": categories.KEY_PATTERN, "maxLength": 100},
    }
]
_one = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Category"}}}}


class Category(BaseModel):
    """What GET returns (and PUT answers with), declared for the document."""

    key: str
    label: str
    description: str
    verb: str
    delivery: Literal[categories.DELIVERIES]


OPENAPI_MODELS = [categories.CategoryInput, Category]
OPENAPI_PATHS = {
    "/v1/categories": {
        "get": {
            "summary": "Every registered category",
            "security": [{"bearer": []}],
            "responses": {
                "200": {
                    "description": "the registry",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["categories"],
                                "properties": {
                                    "categories": {"type": "array", "items": {"$ref": "#/components/schemas/Category"}}
                                },
                            }
                        }
                    },
                },
                "401": _err,
                "403": _err,
            },
        }
    },
    "/v1/categories/{key}": {
        "put": {
            "summary": "Register or replace a category: its label, description, verb and delivery",
            "security": [{"bearer": []}],
            "parameters": _key_param,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CategoryInput"}}},
            },
            "responses": {
                "200": {"description": "replaced", **_one},
                "201": {"description": "created", **_one},
                "400": _err,
                "401": _err,
                "403": _err,
                "413": _err,
                "422": _err,
            },
        },
        "get": {
            "summary": "Read a category",
            "security": [{"bearer": []}],
            "parameters": _key_param,
            "responses": {
                "200": {"description": "the category", **_one},
                "401": _err,
                "403": _err,
                "404": _err,
                "422": _err,
            },
        },
        "delete": {
            "summary": "Forget a category (digests and pages fall back to its humanised key)",
            "security": [{"bearer": []}],
            "parameters": _key_param,
            "responses": {"204": {"description": "deleted"}, "401": _err, "403": _err, "404": _err, "422": _err},
        },
    },
}
