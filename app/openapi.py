"""OpenAPI document assembled from the OPENAPI_PATHS each route module declares."""
from __future__ import annotations

from starlette.requests import Request

from app.http import FastJSONResponse

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object", "properties": {
            "index": {"type": "integer"}, "field": {"type": "string"}, "message": {"type": "string"}}}},
    },
}


def build(modules) -> dict:
    paths, schemas = {}, {"Error": ERROR_SCHEMA}
    for module in modules:
        for path, ops in getattr(module, "OPENAPI_PATHS", {}).items():
            paths.setdefault(path, {}).update(ops)
        schemas.update(getattr(module, "OPENAPI_SCHEMAS", {}))
    return {
        "openapi": "3.0.3",
        "info": {"title": "Notify: digest-first notification service", "version": "1.0.0"},
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
            "responses": {"Error": {"description": "error", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Error"}}}}},
        },
    }


def endpoint(document: dict):
    async def openapi_json(request: Request):
        return FastJSONResponse(document)
    return openapi_json
