"""Shared HTTP plumbing for the JSON API: error bodies, bounded body reading, bearer auth."""
from __future__ import annotations

import json
import re

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app import apikeys, config


class FastJSONResponse(Response):
    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content)


class ApiError(Exception):
    """Raised anywhere in an API endpoint; rendered as {"error", "message", "errors"?}."""

    def __init__(self, status: int, code: str, message: str, errors: list | None = None, headers=None):
        super().__init__(message)
        self.status, self.code, self.message, self.errors, self.headers = status, code, message, errors, headers

    def response(self) -> Response:
        body = {"error": self.code, "message": self.message}
        if self.errors is not None:
            body["errors"] = self.errors
        return FastJSONResponse(body, status_code=self.status, headers=self.headers)


async def api_error_handler(request: Request, exc: ApiError) -> Response:
    return exc.response()


def field_error(field: str, message: str, index: int | None = None) -> dict:
    err = {"field": field, "message": message}
    if index is not None:
        err = {"index": index, **err}
    return err


def validation_error(errors: list[dict]) -> ApiError:
    return ApiError(422, "validation_failed", f"{len(errors)} problem(s) in the request; nothing was stored",
                    errors)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 past the limit, checked on Content-Length and again while streaming."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "bad_request", "Content-Length is not a number")
        if int(declared) > limit:
            raise ApiError(413, "body_too_large", f"request body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_LONG_DIGITS = re.compile(rb"\d{20}")   # 2**64 has 20 digits


async def read_json(request: Request, limit: int | None = None):
    """The body parsed as JSON; 413 past the limit, 400 if empty or malformed."""
    body = await read_body(request, limit or config.get().max_body_bytes)
    if not body:
        raise ApiError(400, "malformed_json", "request body is empty; expected JSON")
    try:
        value = orjson.loads(body)      # strict RFC 8259 (no NaN, no lone surrogates): the syntax check
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from None
    if _LONG_DIGITS.search(body):
        # orjson reads an integer past 64 bits as a float, silently rounding it. The standard
        # library keeps it exact, so validation refuses it by field name instead of storing a
        # different number.
        value = json.loads(body)
    return value


async def require_key(request: Request, scope: str) -> apikeys.Principal:
    header = request.headers.get("authorization", "")
    kind, _, key = header.partition(" ")
    if kind.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "missing API key: send 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    key = key.strip()
    principal = apikeys.cache.peek(key) or await run_in_threadpool(apikeys.cache.lookup, key)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    if not principal.allows(scope):
        raise ApiError(403, "forbidden", f"this key has scope '{principal.scope}'; '{scope}' is required")
    return principal
