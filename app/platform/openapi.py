"""Routes declared once, and the OpenAPI document generated from them.

`api_route` makes a Starlette Route whose methods each carry an `Operation`: summary, request body
model, answers (description and model), error statuses and the API-key scope. The route enforces
the scope (401/403 before the endpoint runs) and `build` walks the app's routes to write
/openapi.json, so a path, a method, a scope or a body schema is written in one place: the models
that validate the requests are the schemas in the document.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.platform.http import FastJSONResponse, require_key
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
_ERROR = {"$ref": "#/components/responses/Error"}
JSON = dict[str, Any]  # a part of the document
Endpoint = Callable[..., Any]  # a request endpoint, or an ASGI app (the tracking routes)


def free_form_values(schema: JSON) -> None:
    """json_schema_extra for a `dict[str, Any] | None` field: its values are JsonValue."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "object":
            option["additionalProperties"] = _VALUE_REF


@dataclass(frozen=True)
class Operation:
    """One method of a route, as the document shows it and as the route enforces it.

    responses: status -> description, or (description, model) for a JSON answer of that model.
    errors:    statuses answered with the API's JSON error body (401 and 403 come with a scope).
    body:      the request body's model, or a tuple of models (the body is one of them).
    scope:     the API-key scope the route requires (a bearer key, checked before the endpoint).
    bearer:    documented bearer authentication that the endpoint checks itself (GET /metrics).
    query:     a model whose fields are the query parameters.
    description: more than the summary says, when it needs saying.
    media_types: the request body's accepted media types (PATCH takes a JSON merge patch too).
    """

    summary: str
    responses: Mapping[int, str | tuple[str, type[BaseModel]]]
    errors: tuple[int, ...] = ()
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None
    scope: str | None = None
    bearer: bool = False
    query: type[BaseModel] | None = None
    description: str = ""
    media_types: tuple[str, ...] = ("application/json",)
    models: tuple[type[BaseModel], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        bodies = self.body if isinstance(self.body, tuple) else (self.body,) if self.body else ()
        answers = tuple(answer[1] for answer in self.responses.values() if isinstance(answer, tuple))
        object.__setattr__(self, "models", bodies + answers)


class ApiRoute(Route):
    """A Route with its operations (by upper-case method) and its path parameters' types."""

    operations: dict[str, Operation]
    path_types: dict[str, Any]


def api_route(
    path: str, endpoint: Endpoint, *, path_params: Mapping[str, Any] | None = None, **operations: Operation
) -> Route:
    """`api_route("/v1/things/{key}", endpoint, path_params={"key": KeyType}, get=Operation(...), ...)`.
    One endpoint serves every method given, so a 405 names them all in its Allow header; the
    endpoint reads the checked key's principal from `request.state.principal`."""
    ops = {method.upper(): op for method, op in operations.items()}
    scopes = {method: op.scope for method, op in ops.items() if op.scope}
    if scopes:
        endpoint = _requiring(endpoint, scopes)
    route = ApiRoute(path, endpoint, methods=list(ops))
    missing = set(route.param_convertors) - set(path_params or {})
    if missing:
        raise TypeError(f"{path}: declare the type of path parameter(s) {sorted(missing)}")
    route.operations = ops
    route.path_types = dict(path_params or {})
    return route


def _requiring(
    endpoint: Callable[[Request], Awaitable[Response]], scopes: dict[str, str]
) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(endpoint)
    async def authenticated(request: Request) -> Response:
        scope = scopes.get("GET" if request.method == "HEAD" else request.method)
        if scope is not None:
            request.state.principal = await require_key(request, scope)
        return await endpoint(request)

    return authenticated


def _schema(annotation: Any) -> JSON:
    adapter = annotation if isinstance(annotation, TypeAdapter) else TypeAdapter(annotation)
    return adapter.json_schema()


def _ref(model: type[BaseModel]) -> JSON:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(schema: JSON) -> JSON:
    return {"application/json": {"schema": schema}}


def _query_parameters(model: type[BaseModel]) -> list[JSON]:
    properties = model.model_json_schema(mode="validation")["properties"]
    out = []
    for name, info in model.model_fields.items():
        schema = dict(properties[name])
        schema.pop("title", None)
        if schema.get("default", 0) is None:
            del schema["default"]
        # An optional parameter is an absent one: its `null` alternative has no spelling in a URL.
        options = [o for o in schema.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            schema = {**options[0], **schema}
        elif options:
            schema["anyOf"] = options
        description = schema.pop("description", None)
        parameter = {"name": name, "in": "query", "required": info.is_required(), "schema": schema}
        out.append({**parameter, "description": description} if description else parameter)
    return out


def _operation(op: Operation, path_parameters: list[JSON]) -> JSON:
    doc: dict[str, Any] = {"summary": op.summary}
    if op.description:
        doc["description"] = op.description
    if op.scope or op.bearer:
        doc["security"] = [{"bearer": []}]
    parameters = path_parameters + (_query_parameters(op.query) if op.query else [])
    if parameters:
        doc["parameters"] = parameters
    if op.body is not None:
        bodies = op.body if isinstance(op.body, tuple) else (op.body,)
        schema = _ref(bodies[0]) if len(bodies) == 1 else {"oneOf": [_ref(m) for m in bodies]}
        doc["requestBody"] = {"required": True, "content": {media: {"schema": schema} for media in op.media_types}}
    responses: dict[str, Any] = {}
    for status, answer in op.responses.items():
        if isinstance(answer, tuple):
            description, model = answer
            responses[str(status)] = {"description": description, "content": _json(_ref(model))}
        else:
            responses[str(status)] = {"description": answer}
    auth_errors = (401, 403) if op.scope or op.bearer else ()
    for status in sorted({*op.errors, *auth_errors}):
        responses[str(status)] = _ERROR
    doc["responses"] = responses
    return doc


def operations(routes: Iterable[BaseRoute]) -> dict[str, dict[str, Operation]]:
    """OpenAPI path -> lower-case method -> Operation, for every declared route."""
    out: dict[str, dict[str, Operation]] = {}
    for route in routes:
        if isinstance(route, ApiRoute):
            out.setdefault(route.path_format, {}).update({m.lower(): op for m, op in route.operations.items()})
    return out


def build(routes: Iterable[BaseRoute]) -> JSON:
    paths: dict[str, JSON] = {}
    models: list[type[BaseModel]] = [Error]
    for route in routes:
        if not isinstance(route, ApiRoute):
            continue
        path_parameters = [
            {"name": name, "in": "path", "required": True, "schema": _schema(annotation)}
            for name, annotation in route.path_types.items()
        ]
        for method, op in route.operations.items():
            paths.setdefault(route.path_format, {})[method.lower()] = _operation(op, path_parameters)
            models.extend(m for m in op.models if m not in models)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Notify: digest-first notification service", "version": "1.0.0"},
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {**schema_components(models), "JsonValue": JSON_VALUE},
            "responses": {"Error": {"description": "error", "content": _json(_ref(Error))}},
        },
    }


def endpoint(document: JSON) -> Callable[[Request], Awaitable[Response]]:
    async def openapi_json(request: Request) -> Response:
        return FastJSONResponse(document)

    return openapi_json
