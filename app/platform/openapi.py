"""OpenAPI document: the operations each route module lists in OPENAPI_PATHS, and the schemas of the
pydantic models it lists in OPENAPI_MODELS — the same models that validate the requests."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request

from app.platform.http import FastJSONResponse
from app.platform.validation import schema_components


class Problem(BaseModel):
    index: int | None = None
    field: str
    message: str


class Error(BaseModel):
    error: str
    message: str
    errors: list[Problem] | None = None


# Any JSON value as a payload keeps it: integers within 64 bits (signed or unsigned, what the JSON
# encoder and jsonb store exactly; a larger one is refused by name, never rounded), other numbers,
# strings, and arrays and objects of the same.
_VALUE_REF = {"$ref": "#/components/schemas/JsonValue"}
JSON_VALUE = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": _VALUE_REF},
        {"type": "object", "additionalProperties": _VALUE_REF},
    ]
}


def free_form_values(schema: dict) -> None:
    """json_schema_extra for a `dict[str, Any] | None` field: its values are JsonValue."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "object":
            option["additionalProperties"] = _VALUE_REF


def build(modules) -> dict:
    paths: dict[str, dict] = {}
    models: list[type[BaseModel]] = [Error]
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
            "schemas": {**schema_components(models), "JsonValue": JSON_VALUE},
            "responses": {
                "Error": {
                    "description": "error",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
            },
        },
    }


def endpoint(document: dict):
    async def openapi_json(request: Request):
        return FastJSONResponse(document)

    return openapi_json
