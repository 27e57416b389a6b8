"""Admin API for newsletters: create, send to an audience, pause/resume/cancel, retry failed rows,
and status with delivery counts and engagement. All endpoints need an admin-scope key."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app.newsletter import service, template, test_send
from app.newsletter.service import (
    Cancelled,
    NewsletterInput,
    NewsletterPage,
    NewsletterState,
    NewsletterStatus,
    Requeued,
    SendRequested,
)
from app.newsletter.test_send import TestResult
from app.platform.errors import NotFound
from app.platform.openapi import Example, Operation, api_route
from app.platform.validation import plain_int

# Body limits are derived from the documented maxLength/maxItems, so every schema-valid request fits
# (413 is never the answer to a valid request) and one over a field's limit still gets the precise
# 422: JSON may spell one character in up to 12 bytes ("\ud83d\ude00", as ensure_ascii encoders
# do), plus room for keys, punctuation and whitespace.
_JSON_BYTES_PER_CHAR = 12
_USER_ID_MAX = 200
CREATE_BODY_LIMIT = (
    _JSON_BYTES_PER_CHAR * (template.MAX_SUBJECT + template.MAX_HTML + template.MAX_TEXT + template.MAX_FROM)
    + _JSON_BYTES_PER_CHAR * service.MAX_VARIANTS_CHARS  # every variant's subject, html and text together
    + service.MAX_VARIANTS * 1024  # each variant's tag, keys and punctuation
    + 64 * 1024
)  # ~35 MB
TEST_BODY_LIMIT = test_send.MAX_ADDRESSES * (_JSON_BYTES_PER_CHAR * 254 + 8) + 64 * 1024
SEND_BODY_LIMIT = service.MAX_AUDIENCE_USER_IDS * (_JSON_BYTES_PER_CHAR * _USER_ID_MAX + 8) + 64 * 1024  # ~24 MB


def _newsletter_id(text: object) -> int:
    # Matched as a string (not {newsletter_id:int}), so "/v1/newsletters/abc" gets the API's JSON 404
    # rather than the router's plain-text one: an id that is no integer names no newsletter.
    newsletter_id = plain_int(text, 19)
    if newsletter_id is None or not 0 < newsletter_id < 2**63:
        raise NotFound(service.NOT_FOUND)
    return newsletter_id


async def create_newsletter(request: Request, body: NewsletterInput):
    newsletter_id = await run_in_threadpool(service.create, body)
    return NewsletterState(id=newsletter_id, status="draft")


async def list_newsletters(request: Request, query: service.NewsletterListQuery):
    return await run_in_threadpool(service.list_newsletters, query)


async def newsletters_collection(request: Request, **declared):
    # One route for both methods, so a 405 on the path names both in its Allow header.
    return await (list_newsletters if request.method in ("GET", "HEAD") else create_newsletter)(request, **declared)


async def get_newsletter(request: Request, newsletter_id: int):
    return await run_in_threadpool(service.newsletter_status, newsletter_id)


async def send_newsletter(request: Request, newsletter_id: int, body: service.NewsletterAudience):
    audience = body.recipients()
    status = await run_in_threadpool(
        service.request_send, newsletter_id, audience, body.send_at, body.local_time, body.respect_quiet_hours
    )
    unknown, unknown_count = await run_in_threadpool(service.unknown_user_ids, audience)
    return SendRequested(
        id=newsletter_id, status=status, unknown_user_ids=unknown, unknown_user_ids_count=unknown_count
    )


async def test_newsletter(request: Request, newsletter_id: int, body: test_send.TestSendInput):
    results = await run_in_threadpool(test_send.send, newsletter_id, body.addresses(), None, body.locale)
    return TestSendAnswer(id=newsletter_id, results=results)


async def pause_newsletter(request: Request, newsletter_id: int):
    return NewsletterState(id=newsletter_id, status=await run_in_threadpool(service.pause, newsletter_id))


async def resume_newsletter(request: Request, newsletter_id: int):
    return NewsletterState(id=newsletter_id, status=await run_in_threadpool(service.resume, newsletter_id))


async def cancel_newsletter(request: Request, newsletter_id: int):
    return await run_in_threadpool(service.cancel, newsletter_id)


async def retry_failed(request: Request, newsletter_id: int):
    return await run_in_threadpool(service.retry_failed, newsletter_id)


class TestSendAnswer(BaseModel):
    """POST /v1/newsletters/{id}/test: one result per address (spellings of one address are one), in the
    order given."""

    id: int
    results: list[TestResult]


# Constraints before the validator: after it, pydantic documents them as unknown keywords.
NewsletterId = Annotated[int, Field(ge=1, le=2**63 - 1), BeforeValidator(_newsletter_id)]
_ID = {"newsletter_id": NewsletterId}


# The reference's examples: the quick start's newsletter (README), sent to its one subscriber.
_SUBJECT = "News{{#name}} for {{name}}{{/name}}"
_CREATE = {
    "subject": _SUBJECT,
    "html": "<p>{{greeting}} we shipped.</p>",
    "variants": {
        "pt-BR": {"subject": "Novidades{{#name}} para {{name}}{{/name}}", "html": "<p>{{greeting}} lançamos.</p>"}
    },
}
_NEWSLETTER = {"newsletter_id": 1}
_SUMMARY = {
    "id": 1,
    "subject": _SUBJECT,
    "status": "done",
    "audience": {"kind": "user_ids", "count": 1},
    "created_at": "2026-11-28T09:00:00+00:00",
    "send_requested_at": "2026-11-28T09:01:00+00:00",
    "send_at": None,
    "started_at": "2026-11-28T09:01:00+00:00",
    "local_time": None,
    "respect_quiet_hours": False,
    "completed_at": "2026-11-28T09:01:02+00:00",
    "counts": {"pending": 0, "sending": 0, "sent": 1, "failed": 0, "suppressed": 0, "cancelled": 0, "total": 1},
    "variant_locales": ["pt-BR"],
}
_ENGAGED = {"total": 2, "human": 1, "machine": 1, "unique_human": 1}
_STATUS = {
    **_SUMMARY,
    "from": None,
    "outbox_completed_at": "2026-11-28T09:01:01+00:00",
    "opens": _ENGAGED,
    "clicks": {"total": 0, "human": 0, "machine": 0, "unique_human": 0},
    "bounces": 0,
    "unsubscribes": 0,
    "variants": [
        {"locale": None, "recipients": 1, "sent": 1, "opened": 1, "clicked": 0},
        {"locale": "pt-BR", "recipients": 0, "sent": 0, "opened": 0, "clicked": 0},
    ],
}


def _action(path: str, endpoint, summary: str, status: int, answer: tuple[str, type[BaseModel]], example: dict):
    operation = Operation(
        summary,
        {status: answer},
        errors=(404, 409),
        scope="admin",
        example=Example(_NEWSLETTER, answers={status: example}),
    )
    return api_route(f"/v1/newsletters/{{newsletter_id}}/{path}", endpoint, path_params=_ID, post=operation)


routes = [
    api_route(
        "/v1/newsletters",
        newsletters_collection,
        get=Operation(
            "List newsletters, newest first, with status, row counts and their variants' locales (keyset pages)",
            {200: ("one page", NewsletterPage)},
            errors=(422,),
            query=service.NewsletterListQuery,
            scope="admin",
            example=Example({"limit": 1}, answers={200: {"newsletters": [_SUMMARY], "next_before": 1}}),
        ),
        post=Operation(
            "Create a newsletter (draft)",
            {201: ("created", NewsletterState)},
            errors=(400, 413, 422),
            body=NewsletterInput,
            scope="admin",
            body_limit=CREATE_BODY_LIMIT,
            example=Example(request=_CREATE, answers={201: {"id": 1, "status": "draft"}}),
        ),
    ),
    api_route(
        "/v1/newsletters/{newsletter_id}",
        get_newsletter,
        path_params=_ID,
        get=Operation(
            "Status, per-row counts (total, pending, sending, sent, failed, suppressed, cancelled), "
            "opens/clicks (human vs machine), bounces, unsubscribes, and per variant (language) "
            "recipients, sent, opened and clicked",
            {200: ("status", NewsletterStatus)},
            errors=(404,),
            scope="admin",
            example=Example(_NEWSLETTER, answers={200: _STATUS}),
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
            body_limit=SEND_BODY_LIMIT,
            example=Example(
                _NEWSLETTER,
                {"audience": {"user_ids": ["you"]}},
                {202: {"id": 1, "status": "queued", "unknown_user_ids": [], "unknown_user_ids_count": 0}},
            ),
        ),
    ),
    api_route(
        "/v1/newsletters/{newsletter_id}/test",
        test_newsletter,
        path_params=_ID,
        post=Operation(
            "Send the newsletter now to a few addresses, in any status (drafts too): no outbox row, no "
            "tracking, subject prefixed [Test] (in the variant's language); the variant of `locale`, or of "
            "each address's subscriber; suppressed addresses are refused",
            {200: ("handed to the provider (per address: sent, failed, suppressed)", TestSendAnswer)},
            errors=(400, 404, 409, 413, 422, 503),
            body=test_send.TestSendInput,
            scope="admin",
            body_limit=TEST_BODY_LIMIT,
            example=Example(
                _NEWSLETTER,
                {"to": ["editor@example.test"], "locale": "pt-BR"},
                {200: {"id": 1, "results": [{"email": "editor@example.test", "status": "sent"}]}},
            ),
        ),
    ),
    _action(
        "pause",
        pause_newsletter,
        "Stop sending within a second, between two mails; recipients claimed but not sent go back to pending",
        200,
        ("paused (or already paused)", NewsletterState),
        {"id": 1, "status": "paused"},
    ),
    _action(
        "resume",
        resume_newsletter,
        "Continue where the send stopped",
        200,
        ("sending (or already queued/sending)", NewsletterState),
        {"id": 1, "status": "sending"},
    ),
    _action(
        "cancel",
        cancel_newsletter,
        "Cancel within a second, between two mails: recipients not yet sent are never sent",
        200,
        ("cancelled", Cancelled),
        {"id": 1, "status": "cancelled", "cancelled_rows": 0},
    ),
    _action(
        "retry-failed",
        retry_failed,
        "Put failed rows back to pending",
        202,
        ("failed rows requeued", Requeued),
        {"id": 1, "status": "sending", "requeued": 1},
    ),
]
