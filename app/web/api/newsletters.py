"""Admin API for newsletters: create, send to an audience, pause/resume/cancel, retry failed rows,
and status with delivery counts and engagement. All endpoints need an admin-scope key."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app.newsletter import rows, service, template, test_send
from app.platform.http import ApiError, FastJSONResponse, read_json, validation_error
from app.platform.openapi import Operation, api_route
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
    body = await read_json(request, limit=CREATE_BODY_LIMIT)
    values, errors = service.validate_new(body)
    if errors:
        raise validation_error(errors)
    newsletter_id = await run_in_threadpool(service.create, values)
    return FastJSONResponse({"id": newsletter_id, "status": "draft"}, status_code=201)


async def list_newsletters(request: Request):
    query, errors = service.validate_list_query(dict(request.query_params))
    if errors or query is None:
        raise validation_error(errors)
    return FastJSONResponse(await run_in_threadpool(service.list_newsletters, query))


async def newsletters_collection(request: Request):
    # One route for both methods, so a 405 on the path names both in its Allow header.
    return await (list_newsletters if request.method in ("GET", "HEAD") else create_newsletter)(request)


async def get_newsletter(request: Request):
    return FastJSONResponse(await _call(service.status, _id(request)))


async def send_newsletter(request: Request):
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
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, "status": await _call(service.pause, newsletter_id)})


async def resume_newsletter(request: Request):
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, "status": await _call(service.resume, newsletter_id)})


async def cancel_newsletter(request: Request):
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, **await _call(service.cancel, newsletter_id)})


async def retry_failed(request: Request):
    newsletter_id = _id(request)
    return FastJSONResponse({"id": newsletter_id, **await _call(service.retry_failed, newsletter_id)}, status_code=202)


STATUSES = tuple(rows.NewsletterStatus)
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


class NewsletterState(BaseModel):
    id: int
    status: Literal[STATUSES]


class SendRequested(NewsletterState):
    unknown_user_ids: Annotated[list[str], Field(max_length=service.UNKNOWN_SHOWN)]
    unknown_user_ids_count: Count


class Cancelled(NewsletterState):
    cancelled_rows: Count


class Requeued(NewsletterState):
    requeued: Count


NewsletterId = Annotated[int, Field(ge=1, le=2**63 - 1)]
_ID = {"newsletter_id": NewsletterId}


def _action(path: str, endpoint, summary: str, status: int, answer: tuple[str, type[BaseModel]]):
    operation = Operation(summary, {status: answer}, errors=(404, 409), scope="admin")
    return api_route(f"/v1/newsletters/{{newsletter_id}}/{path}", endpoint, path_params=_ID, post=operation)


routes = [
    api_route(
        "/v1/newsletters",
        newsletters_collection,
        get=Operation(
            "List newsletters, newest first, with status and row counts (keyset pages)",
            {200: ("one page", NewsletterPage)},
            errors=(422,),
            query=service.NewsletterListQuery,
            scope="admin",
        ),
        post=Operation(
            "Create a newsletter (draft)",
            {201: ("created", NewsletterState)},
            errors=(400, 413, 422),
            body=service.NewsletterInput,
            scope="admin",
        ),
    ),
    api_route(
        "/v1/newsletters/{newsletter_id}",
        get_newsletter,
        path_params=_ID,
        get=Operation(
            "Status, per-row counts (total, pending, sending, sent, failed, suppressed, cancelled), "
            "opens/clicks (human vs machine), bounces, unsubscribes",
            {200: ("status", NewsletterStatus)},
            errors=(404,),
            scope="admin",
        ),
    ),
    api_route(
        "/v1/newsletters/{newsletter_id}/send",
        send_newsletter,
        path_params=_ID,
        post=Operation(
            "Start sending to an audience (idempotent for the same audience), now or at send_at; "
            "with local_time, each recipient at that time of day in their own time zone",
            {
                202: (
                    "send requested (status queued, or scheduled with a send_at); user_ids that are no subscriber "
                    "get no mail and are listed (the first "
                    f"{service.UNKNOWN_SHOWN}, sorted) and counted",
                    SendRequested,
                )
            },
            errors=(400, 404, 409, 413, 422),
            body=service.NewsletterAudience,
            scope="admin",
        ),
    ),
    api_route(
        "/v1/newsletters/{newsletter_id}/test",
        test_newsletter,
        path_params=_ID,
        post=Operation(
            "Send the newsletter now to a few addresses, in any status (drafts too): no outbox row, no "
            "tracking, subject prefixed [Test]; suppressed addresses are refused",
            {200: ("handed to the provider (per address: sent, failed, suppressed)", TestSendAnswer)},
            errors=(400, 404, 409, 413, 422, 503),
            body=test_send.TestSendInput,
            scope="admin",
        ),
    ),
    _action(
        "pause",
        pause_newsletter,
        "Stop sending within a second, between two mails; recipients claimed but not sent go back to pending",
        200,
        ("paused (or already paused)", NewsletterState),
    ),
    _action(
        "resume",
        resume_newsletter,
        "Continue where the send stopped",
        200,
        ("sending (or already queued/sending)", NewsletterState),
    ),
    _action(
        "cancel",
        cancel_newsletter,
        "Cancel within a second, between two mails: recipients not yet sent are never sent",
        200,
        ("cancelled", Cancelled),
    ),
    _action("retry-failed", retry_failed, "Put failed rows back to pending", 202, ("failed rows requeued", Requeued)),
]
