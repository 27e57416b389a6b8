"""Admin API for the category registry (app/subscribers/categories.py): PUT (create or replace), GET, DELETE
one category; GET the list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from pydantic import BaseModel, PlainValidator, WithJsonSchema
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.platform.errors import NotFound
from app.platform.openapi import Example, Operation, api_route
from app.platform.validation import fail
from app.subscribers import categories

# The largest valid body fits: label, description and verb at 12 bytes a character ("\ud83d\ude00"),
# for the category and each of its translations, with room for the keys and punctuation.
_WORDS = 12 * (100 + 500 + 60) + 512
BODY_LIMIT = _WORDS * (1 + categories.MAX_TRANSLATIONS) + 4 * 1024
NOT_FOUND = "no category with that key"


async def put_category(request: Request, key: str, body: categories.CategoryInput):
    record, created = await run_in_threadpool(categories.upsert, key, body.model_dump())
    return Category.model_validate(record), 201 if created else 200


async def get_category(request: Request, key: str):
    record = await run_in_threadpool(categories.get, key)
    if record is None:
        raise NotFound(NOT_FOUND)
    return Category.model_validate(record)


async def delete_category(request: Request, key: str):
    if not await run_in_threadpool(categories.delete, key):
        raise NotFound(NOT_FOUND)
    return Response(status_code=204)


async def list_categories(request: Request):
    return CategoryList.model_validate({"categories": await run_in_threadpool(categories.list_all)})


_BY_METHOD: dict[str, Callable[..., Awaitable[Response]]] = {
    "GET": get_category,
    "HEAD": get_category,
    "PUT": put_category,
    "DELETE": delete_category,
}


async def category(request: Request, key: str, **declared):
    # One route for the three methods, so a 405 carries the full Allow header.
    return await _BY_METHOD[request.method](request, key, **declared)


class CategoryWords(BaseModel):
    label: str
    description: str
    verb: str


class Category(BaseModel):
    """What GET returns (and PUT answers with), declared for the document."""

    key: str
    label: str
    description: str
    verb: str
    delivery: Literal[categories.DELIVERIES]
    translations: dict[str, CategoryWords]


class CategoryList(BaseModel):
    categories: list[Category]


def _key(value: object) -> str:
    if not categories.valid_key(value):
        raise fail("key", categories.KEY_RULE)
    return value  # type: ignore[return-value]  # a str: valid_key says so


CategoryKey = Annotated[
    str,
    PlainValidator(_key),
    WithJsonSchema({"type": "string", "pattern": categories.KEY_PATTERN, "maxLength": 100}),
]

# The reference's examples: the quick start's own category (README).
_CHEER_INPUT = {"label": "Cheers", "verb": "cheered", "description": "Someone cheers a post of yours"}
_CHEER = {"key": "cheer", **_CHEER_INPUT, "delivery": "digest", "translations": {}}
_CHEER_PT = {"label": "Aplausos", "verb": "aplaudiu", "description": "Alguém aplaude um post seu"}
_CHEER_INPUT_PT = {**_CHEER_INPUT, "translations": {"pt-BR": _CHEER_PT}}
_CHEER_WITH_PT = {**_CHEER, "translations": {"pt-BR": _CHEER_PT}}
_KEY = {"key": "cheer"}

routes = [
    api_route(
        "/v1/categories",
        list_categories,
        get=Operation(
            "Every registered category",
            {200: ("the registry", CategoryList)},
            scope="admin",
            example=Example(answers={200: {"categories": [_CHEER_WITH_PT]}}),
        ),
    ),
    api_route(
        "/v1/categories/{key:str}",
        category,
        path_params={"key": CategoryKey},
        put=Operation(
            "Register or replace a category: its label, description, verb, delivery and translations",
            {200: ("replaced", Category), 201: ("created", Category)},
            errors=(400, 413, 422),
            body=categories.CategoryInput,
            scope="admin",
            body_limit=BODY_LIMIT,
            echo="key",
            example=Example(_KEY, _CHEER_INPUT_PT, {201: _CHEER_WITH_PT, 200: _CHEER_WITH_PT}),
        ),
        get=Operation(
            "Read a category",
            {200: ("the category", Category)},
            errors=(404, 422),
            scope="admin",
            example=Example(_KEY, answers={200: _CHEER_WITH_PT}),
        ),
        delete=Operation(
            "Forget a category (digests and pages fall back to its humanised key)",
            {204: "deleted"},
            errors=(404, 422),
            scope="admin",
            example=Example(_KEY),
        ),
    ),
]
