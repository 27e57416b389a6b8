"""Admin API for newsletters: create, send to an audience, pause/resume/cancel, retry failed rows,
and status with delivery counts and engagement. All endpoints need an admin-scope key."""
from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from app.http import ApiError, FastJSONResponse, read_json, require_key, validation_error
from app.newsletter import service

CREATE_BODY_LIMIT = 2 * 1024 * 1024   # html (512 KiB) + text (256 KiB), with room for JSON escaping
SEND_BODY_LIMIT = 1024 * 1024         # up to MAX_AUDIENCE_USER_IDS ids of <= 200 characters... mostly


def _id(request: Request) -> int:
    newsletter_id = request.path_params["newsletter_id"]
    if newsletter_id <= 0 or newsletter_id >= 2 ** 63:
        raise ApiError(404, "not_found", "no newsletter with that id")
    return newsletter_id


async def _call(fn, *args):
    try:
        return await run_in_threadpool(fn, *args)
    except service.NotFound:
        raise ApiError(404, "not_found", "no newsletter with that id") from None
    except service.Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None


async def create_newsletter(request: Request):
    await require_key(request, "admin")
    body = await read_json(request, limit=CREATE_BODY_LIMIT)
    values, errors = service.validate_new(body)
    if errors:
        raise validation_error(errors)
    newsletter_id = await run_in_threadpool(service.create, values)
    return FastJSONResponse({"id": newsletter_id, "status": "draft"}, status_code=201)


async def get_newsletter(request: Request):
    await require_key(request, "admin")
    return FastJSONResponse(await _call(service.status, _id(request)))


async def send_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    body = await read_json(request, limit=SEND_BODY_LIMIT)
    audience, errors = service.validate_audience(body)
    if errors:
        raise validation_error(errors)
    status = await _call(service.request_send, newsletter_id, audience)
    return FastJSONResponse({"id": newsletter_id, "status": status}, status_code=202)


async def pause_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, "status": await _call(service.pause, newsletter_id)})


async def resume_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, "status": await _call(service.resume, newsletter_id)})


async def cancel_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, **await _call(service.cancel, newsletter_id)})


async def retry_failed(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, **await _call(service.retry_failed, newsletter_id)},
                            status_code=202)


routes = [
    Route("/v1/newsletters", create_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id:int}", get_newsletter, methods=["GET"]),
    Route("/v1/newsletters/{newsletter_id:int}/send", send_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id:int}/pause", pause_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id:int}/resume", resume_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id:int}/cancel", cancel_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id:int}/retry-failed", retry_failed, methods=["POST"]),
]

_err = {"$ref": "#/components/responses/Error"}
_id_param = [{"name": "newsletter_id", "in": "path", "required": True, "schema": {"type": "integer"}}]
_vars = "Mustache with name, email, user_id, unsubscribe_url, preferences_url"
_state = {"description": "new state", "content": {"application/json": {"schema": {
    "type": "object", "properties": {"id": {"type": "integer"}, "status": {"type": "string"}}}}}}


def _action(summary: str, code: str = "200") -> dict:
    return {"post": {"summary": summary, "security": [{"bearer": []}], "parameters": _id_param,
                     "responses": {code: _state, "401": _err, "403": _err, "404": _err, "409": _err}}}


OPENAPI_SCHEMAS = {
    "NewsletterInput": {
        "type": "object", "required": ["subject", "html"], "additionalProperties": False,
        "properties": {
            "subject": {"type": "string", "maxLength": 500, "description": _vars},
            "html": {"type": "string", "maxLength": 512 * 1024, "description": _vars + "; CSS is inlined once"},
            "text": {"type": "string", "maxLength": 256 * 1024, "description": _vars + "; derived from html if absent"},
            "from": {"type": "string", "maxLength": 320, "description": "'Name <addr>'; MAIL_FROM if absent"},
        },
    },
    "NewsletterAudience": {
        "type": "object", "required": ["audience"], "additionalProperties": False,
        "properties": {"audience": {"oneOf": [
            {"type": "string", "enum": ["all"], "description": "every subscriber; unsubscribed/suppressed "
                                                                "ones are recorded as suppressed"},
            {"type": "object", "required": ["user_ids"], "properties": {"user_ids": {
                "type": "array", "minItems": 1, "maxItems": service.MAX_AUDIENCE_USER_IDS,
                "items": {"type": "string", "maxLength": 200}}}},
        ]}},
    },
}
OPENAPI_PATHS = {
    "/v1/newsletters": {"post": {
        "summary": "Create a newsletter (draft)", "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/NewsletterInput"}}}},
        "responses": {"201": {"description": "created: {id, status}"}, "400": _err, "401": _err, "403": _err,
                      "413": _err, "422": _err},
    }},
    "/v1/newsletters/{newsletter_id}": {"get": {
        "summary": "Status, per-row counts (total, pending, sending, sent, failed, suppressed, cancelled), "
                   "opens/clicks (human vs machine), bounces, unsubscribes",
        "security": [{"bearer": []}], "parameters": _id_param,
        "responses": {"200": {"description": "status"}, "401": _err, "403": _err, "404": _err},
    }},
    "/v1/newsletters/{newsletter_id}/send": {"post": {
        "summary": "Start sending to an audience (idempotent for the same audience)",
        "security": [{"bearer": []}], "parameters": _id_param,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/NewsletterAudience"}}}},
        "responses": {"202": _state, "400": _err, "401": _err, "403": _err, "404": _err, "409": _err,
                      "413": _err, "422": _err},
    }},
    "/v1/newsletters/{newsletter_id}/pause": _action("Stop claiming new recipients (within a second)"),
    "/v1/newsletters/{newsletter_id}/resume": _action("Continue where the send stopped"),
    "/v1/newsletters/{newsletter_id}/cancel": _action("Cancel: recipients not yet claimed are never sent"),
    "/v1/newsletters/{newsletter_id}/retry-failed": _action("Put failed rows back to pending", "202"),
}
