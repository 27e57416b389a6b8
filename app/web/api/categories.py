"""Admin API for the category registry (app/subscribers/categories.py): PUT (create or replace), GET, DELETE
one category; GET the list."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.platform.http import ApiError, FastJSONResponse, read_put_body, validation_error
from app.platform.openapi import Operation, api_route
from app.subscribers import categories

BODY_LIMIT = 16 * 1024  # the largest valid body (label, description, verb at 12 bytes a character) fits


def _key(request: Request) -> str:
    key = request.path_params["key"]
    if not categories.valid_key(key):
        raise validation_error([{"field": "key", "message": categories.KEY_RULE}])
    return key


async def put_category(request: Request):
    key = _key(request)
    values = await read_put_body(request, "key", key, categories.validate, BODY_LIMIT)
    record, created = await run_in_threadpool(categories.upsert, key, values)
    return FastJSONResponse(record, status_code=201 if created else 200)


async def get_category(request: Request):
    record = await run_in_threadpool(categories.get, _key(request))
    if record is None:
        raise ApiError(404, "not_found", "no category with that key")
    return FastJSONResponse(record)


async def delete_category(request: Request):
    if not await run_in_threadpool(categories.delete, _key(request)):
        raise ApiError(404, "not_found", "no category with that key")
    return Response(status_code=204)


async def list_categories(request: Request):
    return FastJSONResponse({"categories": await run_in_threadpool(categories.list_all)})


_BY_METHOD = {"GET": get_category, "HEAD": get_category, "PUT": put_category, "DELETE": delete_category}


async def category(request: Request):
    # One route for the three methods, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request)


class Category(BaseModel):
    """What GET returns (and PUT answers with), declared for the document."""

    key: str
    label: str
    description: str
    verb: str
    delivery: Literal[categories.DELIVERIES]


class CategoryList(BaseModel):
    categories: list[Category]


CategoryKey = Annotated[str, Field(pattern=categories.KEY_PATTERN, max_length=100)]

routes = [
    api_route(
        "/v1/categories",
        list_categories,
        get=Operation("Every registered category", {200: ("the registry", CategoryList)}, scope="admin"),
    ),
    api_route(
        "/v1/categories/{key:str}",
        category,
        path_params={"key": CategoryKey},
        put=Operation(
            "Register or replace a category: its label, description, verb and delivery",
            {200: ("replaced", Category), 201: ("created", Category)},
            errors=(400, 413, 422),
            body=categories.CategoryInput,
            scope="admin",
        ),
        get=Operation("Read a category", {200: ("the category", Category)}, errors=(404, 422), scope="admin"),
        delete=Operation(
            "Forget a category (digests and pages fall back to its humanised key)",
            {204: "deleted"},
            errors=(404, 422),
            scope="admin",
        ),
    ),
]
