"""Routes declared once, and the OpenAPI document generated from them.

`api_route` makes a Starlette Route whose methods each carry an `Operation`: summary, request body
model, answers (description and model), error statuses and the API-key scope. The route enforces
the scope (401/403 before the endpoint runs) and `build` walks the app's routes to write
/openapi.json, so a path, a method, a scope or a body schema is written in one place: the models
that validate the requests are the schemas in the document.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.platform.errors import DomainError, Invalid, problem
from app.platform.http import ApiError, FastJSONResponse, read_json, require_key
from app.platform.validation import LOCALE_REF, LOCALE_SCHEMA, as_json, check, problems, schema_components


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


def _locales_by_reference(value: Any) -> Any:
    """Every locale schema (validation.LOCALE_SCHEMA: a thousand tags) shown once, as
    #/components/schemas/LocaleTag, and referred to wherever a field or key is a locale."""
    if isinstance(value, dict):
        if value.get("enum") == LOCALE_SCHEMA["enum"]:
            return LOCALE_REF
        return {k: _locales_by_reference(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_locales_by_reference(v) for v in value]
    return value


def free_form_values(schema: JSON) -> None:
    """json_schema_extra for a `dict[str, Any] | None` field: its values are JsonValue."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "object":
            option["additionalProperties"] = _VALUE_REF


Check = Callable[[Request, Any], tuple[Any, list[dict[str, Any]]]]


@dataclass(frozen=True)
class Answer:
    """An example answer that is not (only) a JSON body: its media type and body, or its headers
    (a redirect's Location, a preflight's Access-Control-*)."""

    media_type: str | None = None
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Example:
    """One call of an operation: `params` (path and query parameters by name), `request` (the JSON
    body, when the operation takes one) and `answers` (status -> the JSON body, or an Answer)."""

    params: Mapping[str, Any] = field(default_factory=dict)
    request: Any = None
    answers: Mapping[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """One method of a route, as the document shows it and as the route enforces it.

    responses: status -> description, or (description, model) for a JSON answer of that model.
    errors:    statuses answered with the API's JSON error body (401 and 403 come with a scope, 400,
               413 and 422 with a body: the route reads and validates it).
    body:      the request body's model, or a tuple of models (the body is one of them).
    scope:     the API-key scope the route requires (a bearer key, checked before the endpoint).
    bearer:    documented bearer authentication: `authenticate` checks it, or the endpoint does (GET /metrics).
    query:     a model whose fields are the query parameters.
    description: more than the summary says, when it needs saying.
    media_types: the request body's accepted media types (PATCH takes a JSON merge patch too); with 415
               among the errors they are enforced (the Accept-Patch header names them).

    How the route takes the body in (app/platform/openapi.py `api_route`), before the endpoint runs:
    body_limit:   the largest body read, in bytes (413 past it); MAX_BODY_BYTES when None.
    echo:         a path parameter the body may repeat (what GET returns can be PUT back): it is
                  no field, and a value other than the URL's is a 422.
    check:        check(request, parsed JSON) -> (value, problems), when the model alone does not
                  say what is accepted (a merge patch, a batch refused by its size first); by
                  default the body model validates it.
    check_query:  the same for the query string (check_query(request, its parameters)); by default
                  the query model validates them (a problem with them all names `query`).
    authenticate: a bearer check of the route's own (a feed token), run where a scope's would be:
                  before the body is read; its result is `request.state.principal`.

    example:      one call as a user makes it (its parameters, its body) and what it answers, shown in
                  the reference beside the schemas (tests/web/test_openapi_examples.py holds every
                  example to the models that validate the call and its answer).
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
    body_limit: int | None = None
    echo: str | None = None
    check: Check | None = None
    check_query: Check | None = None
    authenticate: Callable[[Request], Awaitable[Any]] | None = None
    example: Example | None = None
    models: tuple[type[BaseModel], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.example is not None:
            unknown = set(self.example.answers) - set(self.responses)
            if unknown:
                raise TypeError(f"{self.summary}: an example answers {sorted(unknown)}, which it does not declare")
            if self.body is not None and self.example.request is None:
                raise TypeError(f"{self.summary}: the operation takes a body, its example shows none")
        bodies = self.body if isinstance(self.body, tuple) else (self.body,) if self.body else ()
        answers = tuple(answer[1] for answer in self.responses.values() if isinstance(answer, tuple))
        object.__setattr__(self, "models", bodies + answers)
        if self.check is None and len(bodies) > 1:
            raise TypeError(f"{self.summary}: a body of several models needs a check")


class ApiRoute(Route):
    """A Route with its operations (by upper-case method) and its path parameters' types."""

    operations: dict[str, Operation]
    path_types: dict[str, Any]


def api_route(
    path: str,
    endpoint: Endpoint,
    *,
    path_params: Mapping[str, Any] | None = None,
    wrap: Callable[[Endpoint], Endpoint] | None = None,
    **operations: Operation,
) -> Route:
    """`api_route("/v1/things/{key}", endpoint, path_params={"key": KeyType}, get=Operation(...), ...)`.
    One endpoint serves every method given, so a 405 names them all in its Allow header.

    Before the endpoint runs, in this order: the key's scope (or the operation's `authenticate`), its
    principal in `request.state.principal`; each path parameter validated by its declared type (a
    422 naming it, or whatever domain error its validator raises); the query string, when the
    operation declares a query; the body read, parsed and validated as the operation declares it.
    The endpoint is called as `endpoint(request, **path parameters, query=..., body=...)` (query and
    body only when the operation declares them), and checks nothing of them itself. It
    returns a Response, or a result the route serialises with the model declared for its status:
    `result` for the one status whose model it is, or `(result, status)`. A domain error
    (app/platform/errors.py) it raises is answered as the API's error (`ApiError.of`), here only.
    `wrap` goes around all of it (CORS headers on every answer, errors included).
    An endpoint that is no function is an ASGI app, mounted as it is."""
    ops = {method.upper(): op for method, op in operations.items()}
    if inspect.isfunction(endpoint):
        endpoint = _declared(endpoint, ops, _path_checks(path_params or {}))
    elif any(op.scope or op.body or op.authenticate for op in ops.values()):
        raise TypeError(f"{path}: an ASGI app cannot enforce a scope or take a body")
    if wrap is not None:
        endpoint = wrap(endpoint)
    route = ApiRoute(path, endpoint, methods=list(ops))
    missing = set(route.param_convertors) - set(path_params or {})
    if missing:
        raise TypeError(f"{path}: declare the type of path parameter(s) {sorted(missing)}")
    route.operations = ops
    route.path_types = dict(path_params or {})
    return route


def _path_checks(path_params: Mapping[str, Any]) -> dict[str, TypeAdapter[Any]]:
    return {
        name: annotation if isinstance(annotation, TypeAdapter) else TypeAdapter(annotation)
        for name, annotation in path_params.items()
    }


def _declared(endpoint: Endpoint, ops: dict[str, Operation], path_checks: dict[str, TypeAdapter[Any]]) -> Endpoint:
    @functools.wraps(endpoint)
    async def declared(request: Request) -> Response:
        op = ops.get("GET" if request.method == "HEAD" else request.method)
        try:
            if op is not None and op.scope is not None:
                request.state.principal = await require_key(request, op.scope)
            elif op is not None and op.authenticate is not None:
                request.state.principal = await op.authenticate(request)
            arguments = {name: _path_value(name, adapter, request) for name, adapter in path_checks.items()}
            if op is not None and op.query is not None:
                arguments["query"] = _query(request, op)
            if op is not None and op.body is not None:
                arguments["body"] = await _body(request, op, arguments)
            result = await endpoint(request, **arguments)
        except DomainError as exc:
            raise ApiError.of(exc) from None
        if isinstance(result, Response):
            return result
        return _answer(op, *(result if isinstance(result, tuple) else (result, None)))

    return declared


def _path_value(name: str, adapter: TypeAdapter[Any], request: Request) -> Any:
    try:
        return adapter.validate_python(request.path_params[name])
    except ValidationError as exc:
        raise Invalid.of(problems(exc, root=name)) from None


def _query(request: Request, op: Operation) -> Any:
    params = dict(request.query_params)
    if op.check_query is not None:
        value, found = op.check_query(request, params)
    else:
        assert op.query is not None
        value, found = check(op.query, params, root="query")
    if found:
        raise Invalid.of(found)
    return value


async def _body(request: Request, op: Operation, path_values: dict[str, Any]) -> Any:
    if 415 in op.errors:
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type not in op.media_types:
            merge_patch = " (a JSON merge patch, RFC 7396)" if "application/merge-patch+json" in op.media_types else ""
            raise ApiError(
                415,
                "unsupported_media_type",
                f"send the {'patch' if merge_patch else 'body'} as {' or '.join(op.media_types)}{merge_patch}",
                headers={"Accept-Patch": ", ".join(op.media_types)},
            )
    data = await read_json(request, limit=op.body_limit)
    echoed = data.pop(op.echo, None) if op.echo and isinstance(data, dict) else None
    if op.check is not None:
        value, found = op.check(request, data)
    else:
        assert isinstance(op.body, type)
        value, found = check(op.body, data)
    if echoed not in (None, path_values.get(op.echo or "")):
        found = [*found, problem(op.echo or "", "does not match the URL")]
    if found:
        raise Invalid.of(found)
    return value


def _answer(op: Operation | None, result: Any, status: int | None) -> Response:
    """`result` as JSON of the model declared for its status (from its attributes: a dataclass will do)."""
    answers = {s: a[1] for s, a in (op.responses.items() if op else ()) if isinstance(a, tuple)}
    if status is None:
        matching = [s for s, model in answers.items() if isinstance(result, model)] or list(answers)
        if len(matching) != 1:
            raise TypeError(f"no single declared answer for a {type(result).__name__}: return (result, status)")
        status = matching[0]
    model = answers[status]
    if not isinstance(result, model):
        result = model.model_validate(result, from_attributes=True)
    return FastJSONResponse(as_json(result), status_code=status)


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
    example = op.example or Example()
    unknown = set(example.params) - {p["name"] for p in parameters}
    if unknown:
        raise TypeError(f"{op.summary}: an example names parameters it does not have: {sorted(unknown)}")
    if parameters:
        doc["parameters"] = [
            {**p, "example": example.params[p["name"]]} if p["name"] in example.params else p for p in parameters
        ]
    if op.body is not None:
        bodies = op.body if isinstance(op.body, tuple) else (op.body,)
        schema = _ref(bodies[0]) if len(bodies) == 1 else {"oneOf": [_ref(m) for m in bodies]}
        shown = {"example": example.request} if op.example is not None else {}
        doc["requestBody"] = {
            "required": True,
            "content": {media: {"schema": schema, **shown} for media in op.media_types},
        }
    elif example.request is not None:  # a body the endpoint reads and checks itself (a provider's webhook)
        shown = {"schema": {"$ref": "#/components/schemas/JsonValue"}, "example": example.request}
        doc["requestBody"] = {"required": True, "content": dict.fromkeys(op.media_types, shown)}
    responses: dict[str, Any] = {}
    for status, answer in op.responses.items():
        if isinstance(answer, tuple):
            description, model = answer
            responses[str(status)] = {"description": description, "content": _json(_ref(model))}
        else:
            responses[str(status)] = {"description": answer}
        if status in example.answers:
            _add_example(responses[str(status)], example.answers[status])
    auth_errors = (401, 403) if op.scope or op.bearer else ()
    # A declared body is read by the route (api_route): malformed JSON, too large, or refused.
    body_errors = (400, 413, 422) if op.body is not None else ()
    for status in sorted({*op.errors, *auth_errors, *body_errors}):
        responses[str(status)] = _ERROR
    doc["responses"] = responses
    return doc


def _add_example(response: dict[str, Any], answer: Any) -> None:
    """An example answer into a response object: a JSON body beside its schema, or an Answer's
    body under its media type and its headers."""
    if not isinstance(answer, Answer):
        answer = Answer("application/json", answer)
    if answer.media_type is not None:
        content = response.setdefault("content", {})
        content[answer.media_type] = {**content.get(answer.media_type, {}), "example": answer.body}
    if answer.headers:
        response["headers"] = {
            name: {"schema": {"type": "string"}, "example": value} for name, value in answer.headers.items()
        }


def operations(routes: Iterable[BaseRoute]) -> dict[str, dict[str, Operation]]:
    """OpenAPI path -> lower-case method -> Operation, for every declared route."""
    out: dict[str, dict[str, Operation]] = {}
    for route in routes:
        if isinstance(route, ApiRoute):
            out.setdefault(route.path_format, {}).update({m.lower(): op for m, op in route.operations.items()})
    return out


@dataclass(frozen=True)
class Tag:
    """A group of operations in the reference (/docs): every path starting with one of `prefixes`
    (the longest prefix of any tag wins). Tags are listed, and their paths ordered, as declared."""

    name: str
    description: str
    prefixes: tuple[str, ...]


def tag_of(path: str, tags: Sequence[Tag]) -> Tag:
    """The tag whose prefix of `path` is longest; a path no tag claims is a declaration error."""
    matches = [(len(p), tag) for tag in tags for p in tag.prefixes if path == p or path.startswith(p.rstrip("/") + "/")]
    if not matches:
        raise ValueError(f"no OpenAPI tag claims {path}: add its prefix to one")
    return max(matches, key=lambda m: m[0])[1]


def build(routes: Iterable[BaseRoute], tags: Sequence[Tag] = ()) -> JSON:
    """The OpenAPI document of every declared route; with `tags`, each operation is tagged and the
    paths go in the tags' order (the public API first, tracking and health last)."""
    paths: dict[str, JSON] = {}
    models: list[type[BaseModel]] = [Error]
    for route in routes:
        if not isinstance(route, ApiRoute):
            continue
        path_parameters = [
            {"name": name, "in": "path", "required": True, "schema": _schema(annotation)}
            for name, annotation in route.path_types.items()
        ]
        tagged = [tag_of(route.path_format, tags).name] if tags else []
        for method, op in route.operations.items():
            doc = _operation(op, path_parameters)
            if tagged:
                doc = {"tags": tagged, **doc}
            paths.setdefault(route.path_format, {})[method.lower()] = doc
            models.extend(m for m in op.models if m not in models)
    order = {tag.name: i for i, tag in enumerate(tags)}

    def place(path: str) -> tuple[int, str]:
        return (order[tag_of(path, tags).name] if tags else 0, path)

    document: JSON = {
        "openapi": "3.1.0",
        "info": {"title": "Notify: digest-first notification service", "version": "1.0.0"},
    }
    if tags:
        document["tags"] = [{"name": tag.name, "description": tag.description} for tag in tags]
    return {
        **document,
        "paths": {path: paths[path] for path in sorted(paths, key=place)},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_locales_by_reference(schema_components(models)),
                "JsonValue": JSON_VALUE,
                "LocaleTag": LOCALE_SCHEMA,
            },
            "responses": {"Error": {"description": "error", "content": _json(_ref(Error))}},
        },
    }


def endpoint(document: JSON) -> Callable[[Request], Awaitable[Response]]:
    async def openapi_json(request: Request) -> Response:
        return FastJSONResponse(document)

    return openapi_json
