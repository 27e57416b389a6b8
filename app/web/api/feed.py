"""The in-app feed's API: the feed of a subscriber, and seen/read marks from the product (server side)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform.errors import NotFound, problem
from app.platform.http import FastJSONResponse
from app.platform.openapi import Example, Operation, api_route
from app.platform.validation import Text, plain_int
from digest import feed, seen

_USER_ID = TypeAdapter(Text(200, min_length=1))  # as app/web/api/subscribers.py declares it
NO_SUBSCRIBER = "no subscriber with that user_id"


def mark_of(request: Request, body) -> tuple[seen.MarkInput | None, list[dict]]:
    """A seen/read body: `entities` or `"all": true` (seen.validate_mark: more than the model says)."""
    return seen.validate_mark(body)


def _accepted() -> Response:
    return Response(status_code=202)


async def _mark(user_id: str, kind: str, mark: seen.MarkInput) -> Response:
    if not await run_in_threadpool(seen.mark_user, user_id, kind, mark):
        raise NotFound(NO_SUBSCRIBER)
    return _accepted()


async def post_seen(request: Request, user_id: str, body: seen.MarkInput):
    return await _mark(user_id, seen.SEEN, body)


async def post_read(request: Request, user_id: str, body: seen.MarkInput):
    return await _mark(user_id, seen.READ, body)


def feed_query(request: Request, params: dict) -> tuple[dict, list[dict]]:
    """`limit`, `unread`, `before` of a feed request as feed.page takes them, or a problem naming
    each bad one (FeedQuery documents them; the words are these)."""
    errors: list[dict] = []
    out: dict[str, Any] = {}
    unknown = sorted(set(params) - {"limit", "unread", "before"})
    errors += [problem(name, "unknown query parameter") for name in unknown]
    if "limit" in params:
        limit = plain_int(params["limit"], 3)
        if limit is None or not 1 <= limit <= feed.MAX_LIMIT:
            errors.append(problem("limit", f"must be an integer from 1 to {feed.MAX_LIMIT}"))
        out["limit"] = limit
    if "unread" in params:
        if params["unread"] not in ("true", "false"):
            errors.append(problem("unread", "must be true or false"))
        out["unread_only"] = params["unread"] == "true"
    if "before" in params:
        try:
            out["before"] = feed.parse_cursor(params["before"])
        except feed.BadCursor as exc:
            errors.append(problem("before", str(exc)))
    return out, errors


async def get_feed(request: Request, user_id: str, query: dict):

    def load() -> dict | None:  # one trip to the thread pool
        subscriber = feed.find(user_id)
        return None if subscriber is None else feed.page(subscriber, **query)

    page = await run_in_threadpool(load)
    if page is None:
        raise NotFound(NO_SUBSCRIBER)
    return FastJSONResponse(page)


_PATH = {"user_id": _USER_ID}


# The reference's examples: the feed after the quick start's two events (README).
FEED_ITEM = {
    "title": "Launch notes",
    "url": "",
    "has_url": False,
    "lines": [
        {
            "summary": "Bo and Cy cheered",
            "when": "just now",
            "category": "cheer",
            "label": "Cheers",
            "count": 2,
            "avatar_url": "",
            "has_avatar": False,
        }
    ],
    "summary": "Bo and Cy cheered",
    "count": 2,
    "count_label": "2 updates",
    "entity_type": "post",
    "entity_id": "p1",
    "latest_at": "2026-11-28T09:00:00+00:00",
    "latest_event_id": 2,
    "seen": False,
    "unread": True,
}
FEED_EXAMPLE = {"unseen_count": 1, "unread_count": 1, "items": [FEED_ITEM], "next_before": None}
MARK_EXAMPLE = {"entities": [{"entity_type": "post", "entity_id": "p1"}]}


def _mark_route(state: str, endpoint, summary: str) -> Route:
    return api_route(
        f"/v1/subscribers/{{user_id:str}}/{state}",
        endpoint,
        path_params=_PATH,
        post=Operation(
            summary,
            {202: "committed"},
            errors=(400, 404, 413, 422),
            body=seen.MarkInput,
            scope="events",
            check=mark_of,
            example=Example({"user_id": "you"}, MARK_EXAMPLE),
        ),
    )


FEED_ANSWER = (
    "one item per entity, newest activity first, worded as the digest words it: "
    "{unseen_count, unread_count, items, next_before}"
)

routes = [
    api_route(
        "/v1/subscribers/{user_id:str}/feed",
        get_feed,
        path_params=_PATH,
        get=Operation(
            "A subscriber's in-app feed",
            {200: FEED_ANSWER},
            errors=(404, 422),
            query=feed.FeedQuery,
            check_query=feed_query,
            scope="admin",
            example=Example({"user_id": "you", "limit": 20}, answers={200: FEED_EXAMPLE}),
        ),
    ),
    _mark_route(seen.SEEN, post_seen, "Mark entities (or everything) seen for a subscriber"),
    _mark_route(seen.READ, post_read, "Mark entities (or everything) read (and so seen) for a subscriber"),
]
