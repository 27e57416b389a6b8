"""Shared HTTP plumbing for the JSON API: error bodies, bounded body reading, bearer auth."""

from __future__ import annotations

import json
import logging
import re

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response

from app.platform import apikeys, config, db
from app.platform.errors import DomainError

log = logging.getLogger("app.platform.http")


class FastJSONResponse(Response):
    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content)


class ApiError(Exception):
    """Raised anywhere in an API endpoint; rendered as {"error", "message", "errors"?}."""

    def __init__(self, status: int, code: str, message: str, errors: list | None = None, headers=None):
        super().__init__(message)
        self.status, self.code, self.message, self.errors, self.headers = status, code, message, errors, headers

    @classmethod
    def of(cls, exc: DomainError) -> ApiError:
        """The one mapping of a domain error (app/platform/errors.py) to the API's answer."""
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return cls(exc.status, exc.code, exc.message, exc.problems, headers=headers)

    def response(self) -> Response:
        body: dict[str, object] = {"error": self.code, "message": self.message}
        if self.errors is not None:
            body["errors"] = self.errors
        return FastJSONResponse(body, status_code=self.status, headers=self.headers)


async def api_error_handler(request: Request, exc: ApiError) -> Response:
    return exc.response()


async def client_disconnected_handler(request: Request, exc: ClientDisconnect) -> Response:
    """A client that went away while sending its request is no error of ours: one INFO line naming
    the route (its template: a path may hold a token), no traceback. Nothing is sent back to it."""
    route = getattr(request.scope.get("route"), "path", "?")
    log.info("client went away during %s %s; request dropped", request.method, route)
    return Response(status_code=499)


# Under these prefixes every answer is JSON in the API's error shape, the router's own 404 and 405 too.
API_PREFIXES = ("/v1", "/webhooks")


def is_api_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in API_PREFIXES)


_ROUTER_ERRORS = {
    404: ("not_found", "no such endpoint: see /openapi.json or /docs for the API"),
    405: ("method_not_allowed", "this method is not allowed on this endpoint (the Allow header lists those that are)"),
}


async def http_exception_handler(request: Request, exc: HTTPException) -> Response:
    """The router's 404 and 405 (and any HTTPException): in the API's JSON error shape under /v1 and
    /webhooks (a 405 keeps its Allow header), as Starlette's plain text elsewhere."""
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    if is_api_path(request.url.path):
        code, message = _ROUTER_ERRORS.get(exc.status_code, ("http_error", exc.detail))
        return ApiError(exc.status_code, code, message, headers=exc.headers).response()
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


async def server_error_handler(request: Request, exc: Exception) -> Response:
    """An unexpected error (Starlette's ServerErrorMiddleware logs it and re-raises it for the server
    and Sentry): under /v1 and /webhooks the answer is still JSON in the error shape."""
    if is_api_path(request.url.path):
        return ApiError(500, "internal_error", "an unexpected error on our side; it was logged").response()
    return PlainTextResponse("Internal Server Error", status_code=500)


def exception_handlers() -> dict:
    """Every Starlette app's (the web app, the metrics exporter): ApiError as its JSON body, the
    router's 404/405 and an unexpected 500 as JSON under /v1 and /webhooks, Postgres unavailable
    as 503, a client that disconnected mid-request as one INFO line."""
    handlers = {
        ApiError: api_error_handler,
        HTTPException: http_exception_handler,
        ClientDisconnect: client_disconnected_handler,
        Exception: server_error_handler,
    }
    handlers.update(dict.fromkeys(db.UNAVAILABLE, database_unavailable_handler))
    return handlers


RETRY_AFTER_SECONDS = "5"


async def database_unavailable_handler(request: Request, exc: Exception) -> Response:
    """503 + Retry-After on every route (authentication included) while Postgres is unavailable:
    the client retries, nothing was committed. Never a 500."""
    log.warning(
        "database unavailable for %s %s: %s",
        request.method,
        request.url.path,
        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
    )
    headers = {"Retry-After": RETRY_AFTER_SECONDS}
    if is_api_path(request.url.path):
        return ApiError(
            503, "unavailable", "the database is unavailable; nothing was changed, retry later", headers=headers
        ).response()
    return PlainTextResponse("Temporarily unavailable, please try again in a moment.", status_code=503, headers=headers)


class BadContentLength(ValueError):
    pass


def declared_length(headers) -> int | None:
    """The Content-Length the client declared, or None. BadContentLength unless every copy of the
    header is the same plain ASCII number: str.isdigit() alone accepts '²' and '٣', which int()
    then refuses or reads as another number."""
    values = {v.strip() for v in headers.getlist("content-length")}
    if not values:
        return None
    if len(values) > 1:
        raise BadContentLength("conflicting Content-Length headers")
    raw = values.pop()
    if not (raw.isascii() and raw.isdigit()):
        raise BadContentLength("Content-Length is not a number")
    raw = raw.lstrip("0") or "0"
    # Past 18 digits it is over any limit; int() of a long run is slow and refuses > 4300 digits.
    return int(raw) if len(raw) <= 18 else 10**18


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 past the limit, checked on Content-Length and again while streaming."""
    try:
        declared = declared_length(request.headers)
    except BadContentLength as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    if declared is not None and declared > limit:
        raise ApiError(413, "body_too_large", f"request body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_LONG_DIGITS = re.compile(rb"\d{19}")  # -2**63 - 1 has 19 digits, 2**64 has 20
# Nothing we accept nests deeper than a few levels (SendGrid events are flat, event payloads are
# small objects). The bound keeps every later recursive step safe: orjson.dumps stops at 255
# levels, the standard library's parser at the interpreter's recursion limit.
MAX_JSON_DEPTH = 64
# The standard library refuses to convert more than 4300 digits (a ValueError, not a parse error);
# no field here holds more than 64 bits.
MAX_JSON_INT_DIGITS = 1000


class JSONBodyError(ValueError):
    """The body is not JSON we accept; the message names the problem and is safe to return."""


def _too_deep(value, limit: int) -> bool:
    stack = [(value, 1)]  # iterative: a recursive walk would hit the limit it is checking
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise JSONBodyError(f"request body has an integer of more than {MAX_JSON_INT_DIGITS} digits")
    return int(text)


def parse_json(body: bytes, exact_integers: bool = False):
    """JSON from untrusted bytes; JSONBodyError when malformed or nested deeper than MAX_JSON_DEPTH.
    exact_integers: integers past 64 bits stay exact instead of becoming floats."""
    try:
        value = orjson.loads(body)  # strict RFC 8259 (no NaN, no lone surrogates): the syntax check
    except orjson.JSONDecodeError as exc:
        raise JSONBodyError(f"request body is not valid JSON: {exc}") from None
    # Cheap first: a body with few brackets cannot be deep, so single objects skip the walk.
    if (
        type(value) in (dict, list)
        and body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH
        and _too_deep(value, MAX_JSON_DEPTH)
    ):
        raise JSONBodyError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    if exact_integers and _LONG_DIGITS.search(body):
        # orjson reads an integer past 64 bits as a float, silently rounding it. The standard
        # library keeps it exact, so validation refuses it by field name instead of storing a
        # different number. Safe to recurse now: the depth is bounded above.
        value = json.loads(body, parse_int=_bounded_int)
    return value


async def read_json(request: Request, limit: int | None = None):
    """The body parsed as JSON; 413 past the limit, 400 if empty, malformed or too deep."""
    body = await read_body(request, limit or config.get().max_body_bytes)
    if not body:
        raise ApiError(400, "malformed_json", "request body is empty; expected JSON")
    try:
        return parse_json(body, exact_integers=True)
    except JSONBodyError as exc:
        raise ApiError(400, "malformed_json", str(exc)) from None


async def require_key(request: Request, scope: str) -> apikeys.Principal:
    header = request.headers.get("authorization", "")
    kind, _, key = header.partition(" ")
    if kind.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = key.strip()
    principal = apikeys.cache.peek(key)
    if principal is None and not apikeys.cache.known_unknown(key):
        principal = await run_in_threadpool(apikeys.cache.lookup, key)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    if not principal.allows(scope):
        raise ApiError(403, "forbidden", f"this key has scope '{principal.scope}'; '{scope}' is required")
    return principal
