"""Admin API for newsletters: create, send to an audience, pause/resume/cancel, retry failed rows,
and status with delivery counts and engagement. All endpoints need an admin-scope key."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from app.newsletter import rows, service, template, test_send
from app.platform.http import ApiError, FastJSONResponse, read_json, require_key, validation_error
from app.platform.validation import plain_int

# Body limits are derived from the documented maxLength/maxItems, so every schema-valid request fits
# (413 is never the answer to a valid request) and one over a field's limit still gets the precise
# 422: JSON may spell one character in up to 12 bytes ("\ud83d\ude00", as ensure_ascii encoders
# do), plus room for keys, punctuation and whitespace.
_JSON_BYTES_PER_CHAR = 12
_USER_ID_MAX = 200
CREATE_BODY_LIMIT = (
    _JSON_BYTES_PER_CHAR * (template.MAX_SUBJECT + template.MAX_HTML + template.MAX_TEXT + template.MAX_FROM)
    + 64 * 1024
)  # ~9.5 MB
TEST_BODY_LIMIT = test_send.MAX_ADDRESSES * (_JSON_BYTES_PER_CHAR * 254 + 8) + 64 * 1024
SEND_BODY_LIMIT = service.MAX_AUDIENCE_USER_IDS * (_JSON_BYTES_PER_CHAR * _USER_ID_MAX + 8) + 64 * 1024  # ~24 MB


def _id(request: Request) -> int:
    # Matched as a string (not {newsletter_id:int}), so "/v1/newsletters/abc" gets the API's JSON 404
    # rather than the router's plain-text one.
    newsletter_id = plain_int(request.path_params["newsletter_id"], 19)
    if newsletter_id is None or not 0 < newsletter_id < 2**63:
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


async def list_newsletters(request: Request):
    await require_key(request, "admin")
    query, errors = service.validate_list_query(dict(request.query_params))
    if errors or query is None:
        raise validation_error(errors)
    return FastJSONResponse(await run_in_threadpool(service.list_newsletters, query))


async def newsletters_collection(request: Request):
    # One route for both methods, so a 405 on the path names both in its Allow header.
    return await (list_newsletters if request.method in ("GET", "HEAD") else create_newsletter)(request)


async def get_newsletter(request: Request):
    await require_key(request, "admin")
    return FastJSONResponse(await _call(service.status, _id(request)))


async def send_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    body = await read_json(request, limit=SEND_BODY_LIMIT)
    send, errors = service.validate_send(body)
    if errors or send is None:
        raise validation_error(errors)
    audience = send["audience"]
    status = await _call(service.request_send, newsletter_id, audience, send["send_at"], send["local_time"])
    unknown, unknown_count = await run_in_threadpool(service.unknown_user_ids, audience)
    return FastJSONResponse(
        {"id": newsletter_id, "status": status, "unknown_user_ids": unknown, "unknown_user_ids_count": unknown_count},
        status_code=202,
    )


async def test_newsletter(request: Request):
    await require_key(request, "admin")
    newsletter_id = _id(request)
    body = await read_json(request, limit=TEST_BODY_LIMIT)
    addresses, errors = test_send.validate(body)
    if errors or addresses is None:
        raise validation_error(errors)
    try:
        results = await run_in_threadpool(test_send.send, newsletter_id, addresses)
    except test_send.NotFound:
        raise ApiError(404, "not_found", "no newsletter with that id") from None
    except test_send.Stopped as exc:
        raise ApiError(409, "sending_stopped", str(exc)) from None
    except test_send.ProviderUnavailable as exc:
        raise ApiError(
            503, "provider_unavailable", f"the mail provider refused the test send; nothing was sent: {exc}"
        ) from None
    return FastJSONResponse({"id": newsletter_id, "results": results})


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
    return FastJSONResponse({"id": newsletter_id, **await _call(service.retry_failed, newsletter_id)}, status_code=202)


routes = [
    Route("/v1/newsletters", newsletters_collection, methods=["GET", "POST"]),
    Route("/v1/newsletters/{newsletter_id}", get_newsletter, methods=["GET"]),
    Route("/v1/newsletters/{newsletter_id}/send", send_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id}/test", test_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id}/pause", pause_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id}/resume", resume_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id}/cancel", cancel_newsletter, methods=["POST"]),
    Route("/v1/newsletters/{newsletter_id}/retry-failed", retry_failed, methods=["POST"]),
]

_err = {"$ref": "#/components/responses/Error"}
_all_errors = ("400", "401", "403", "404", "409", "413", "422")
_id_param = [
    {
        "name": "newsletter_id",
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    }
]
STATUSES = tuple(rows.NewsletterStatus)
_status = {"type": "string", "enum": list(STATUSES)}


def _state(description: str, **extra) -> dict:
    return {
        "description": description,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["id", "status", *extra],
                    "properties": {"id": {"type": "integer"}, "status": _status, **extra},
                }
            }
        },
    }


def _errors(*codes: str) -> dict:
    return dict.fromkeys(codes, _err)


def _action(summary: str, code: str, response: dict) -> dict:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": _id_param,
            "responses": {code: response, **_errors("401", "403", "404", "409")},
        }
    }


_count = {"type": "integer", "minimum": 0}
Count = Annotated[int, Field(ge=0)]


class Engagement(BaseModel):
    total: Count
    human: Count
    machine: Count
    unique_human: Count


class AudienceSummary(BaseModel):
    kind: Literal["all", "user_ids"]
    count: Count | None = None


# One field per status, from the statuses themselves (mypy cannot follow fields given as keywords).
RowCounts = create_model("RowCounts", **dict.fromkeys((*service.ROW_STATUSES, "total"), (Count, ...)))  # type: ignore[call-overload]


class NewsletterSummary(BaseModel):
    """One item of GET /v1/newsletters."""

    id: int
    subject: str
    status: Literal[STATUSES]
    audience: AudienceSummary | None
    created_at: datetime
    send_requested_at: datetime | None
    send_at: datetime | None = Field(description="when a scheduled newsletter starts (null: sent when requested)")
    local_time: str | None = Field(description="HH:MM each recipient gets it at in their own time zone")
    completed_at: datetime | None
    counts: RowCounts


class NewsletterPage(BaseModel):
    """GET /v1/newsletters: newest first; pass `next_before` as `before` for the next page (null: last page)."""

    newsletters: list[NewsletterSummary]
    next_before: int | None


class NewsletterStatus(BaseModel):
    """GET /v1/newsletters/{id} (service.status), declared for the document."""

    id: int
    subject: str
    sender: str | None = Field(alias="from")
    status: Literal[STATUSES]
    audience: AudienceSummary | None
    created_at: datetime
    send_requested_at: datetime | None
    send_at: datetime | None = Field(description="when a scheduled newsletter starts (null: sent when requested)")
    local_time: str | None = Field(description="HH:MM each recipient gets it at in their own time zone")
    outbox_completed_at: datetime | None
    completed_at: datetime | None
    counts: RowCounts
    opens: Engagement
    clicks: Engagement
    bounces: Count
    unsubscribes: Count


class TestResult(BaseModel):
    email: str = Field(
        description='the address\'s canonical form (README "Address identity"); the mail went to the address as given'
    )
    status: Literal["sent", "failed", "suppressed"]
    error: str | None = None


class TestSendAnswer(BaseModel):
    """POST /v1/newsletters/{id}/test: one result per address (spellings of one address are one), in the
    order given."""

    id: int
    results: list[TestResult]


OPENAPI_MODELS = [
    service.NewsletterInput,
    service.NewsletterAudience,
    NewsletterStatus,
    NewsletterPage,
    test_send.TestSendInput,
    TestSendAnswer,
]
_list_params = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": service.LIST_MAX, "default": 20},
    },
    {
        "name": "before",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    },
    {"name": "status", "in": "query", "required": False, "schema": _status},
]
OPENAPI_PATHS = {
    "/v1/newsletters": {
        "post": {
            "summary": "Create a newsletter (draft)",
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewsletterInput"}}},
            },
            "responses": {
                "201": {
                    "description": "created",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["id", "status"],
                                "properties": {"id": {"type": "integer"}, "status": _status},
                            }
                        }
                    },
                },
                **_errors("400", "401", "403", "413", "422"),
            },
        },
        "get": {
            "summary": "List newsletters, newest first, with status and row counts (keyset pages)",
            "security": [{"bearer": []}],
            "parameters": _list_params,
            "responses": {
                "200": {
                    "description": "one page",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewsletterPage"}}},
                },
                **_errors("401", "403", "422"),
            },
        },
    },
    "/v1/newsletters/{newsletter_id}": {
        "get": {
            "summary": "Status, per-row counts (total, pending, sending, sent, failed, suppressed, cancelled), "
            "opens/clicks (human vs machine), bounces, unsubscribes",
            "security": [{"bearer": []}],
            "parameters": _id_param,
            "responses": {
                "200": {
                    "description": "status",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewsletterStatus"}}},
                },
                **_errors("401", "403", "404"),
            },
        }
    },
    "/v1/newsletters/{newsletter_id}/send": {
        "post": {
            "summary": "Start sending to an audience (idempotent for the same audience), now or at send_at; "
            "with local_time, each recipient at that time of day in their own time zone",
            "security": [{"bearer": []}],
            "parameters": _id_param,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewsletterAudience"}}},
            },
            "responses": {
                "202": _state(
                    "send requested (status queued, or scheduled with a send_at); user_ids that are no subscriber "
                    "get no mail and are listed (the first "
                    f"{service.UNKNOWN_SHOWN}, sorted) and counted",
                    unknown_user_ids={"type": "array", "items": {"type": "string"}, "maxItems": service.UNKNOWN_SHOWN},
                    unknown_user_ids_count=_count,
                ),
                **_errors(*_all_errors),
            },
        }
    },
    "/v1/newsletters/{newsletter_id}/test": {
        "post": {
            "summary": "Send the newsletter now to a few addresses, in any status (drafts too): no outbox row, no "
            "tracking, subject prefixed [Test]; suppressed addresses are refused",
            "security": [{"bearer": []}],
            "parameters": _id_param,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TestSendInput"}}},
            },
            "responses": {
                "200": {
                    "description": "handed to the provider (per address: sent, failed, suppressed)",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TestSendAnswer"}}},
                },
                "503": _err,
                **_errors("400", "401", "403", "404", "409", "413", "422"),
            },
        }
    },
    "/v1/newsletters/{newsletter_id}/pause": _action(
        "Stop sending within a second, between two mails; recipients claimed but not sent go back to pending",
        "200",
        _state("paused (or already paused)"),
    ),
    "/v1/newsletters/{newsletter_id}/resume": _action(
        "Continue where the send stopped", "200", _state("sending (or already queued/sending)")
    ),
    "/v1/newsletters/{newsletter_id}/cancel": _action(
        "Cancel within a second, between two mails: recipients not yet sent are never sent",
        "200",
        _state("cancelled", cancelled_rows=_count),
    ),
    "/v1/newsletters/{newsletter_id}/retry-failed": _action(
        "Put failed rows back to pending", "202", _state("failed rows requeued", requeued=_count)
    ),
}
