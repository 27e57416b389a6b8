"""OpenAPI document: the operations each route module lists in OPENAPI_PATHS, and the schemas of the
pydantic models it lists in OPENAPI_MODELS — the same models that validate the requests."""
from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request

from app.http import FastJSONResponse
from app.validation import schema_components


class Problem(BaseModel):
    index: int | None = None
    field: str
    message: str


class Error(BaseModel):
    error: str
    message: str
    errors: list[Problem] | None = None


def build(modules) -> dict:
    paths, models = {}, [Error]
    for module in modules:
        for path, ops in getattr(module, "OPENAPI_PATHS", {}).items():
            paths.setdefault(path, {}).update(ops)
        models.extend(getattr(module, "OPENAPI_MODELS", ()))
    return {
        "openapi": "3.1.0",
        "info": {"title": "Notify: digest-first notification service", "version": "1.0.0"},
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schema_components(models),
            "responses": {"Error": {"description": "error", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Error"}}}}},
        },
    }


def endpoint(document: dict):
    async def openapi_json(request: Request):
        return FastJSONResponse(document)
    return openapi_json
