"""The feed in the browser: a short-lived feed token per subscriber, and the routes a front end calls
with it — GET /v1/feed, POST /v1/feed/seen|read, GET /v1/feed/stream (Server-Sent Events) — with
CORS for FEED_ALLOWED_ORIGINS only.

A feed token (app/platform/tokens.py, purpose "feed") names one subscriber and an expiry, under the
service's signing key; it is checked against the subscriber's token_version on every request, so
bumping it revokes every token. It is not an API key: no other route accepts it, and these routes
accept nothing else.

The stream: one message (`event: feed`) whenever the subscriber's counts or newest activity change,
with the items newer than the last one the client saw (`id:` is the newest event id; a client
reconnecting with Last-Event-ID gets what it missed at once), a comment line as a heartbeat, and
at most FEED_STREAM_MAX_CONNECTIONS open streams per process (503 beyond). Each open stream
is woken by one poller per process (Watcher): every FEED_STREAM_POLL_SECONDS one statement reads what
can change each open stream's feed (digest/feed.py `fingerprints`: index probes), and a stream
recomputes its counts only when that moved. A stream ends when its subscriber is erased or their
token_version moves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace
from typing import Annotated, Any

import orjson
from pydantic import Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.platform import config, shutdown, tokens
from app.platform.errors import NotFound, problem
from app.platform.http import ApiError, FastJSONResponse
from app.platform.openapi import Answer, Endpoint, Example, Operation, api_route
from app.platform.validation import Body
from app.web.api.feed import _USER_ID, FEED_ANSWER, FEED_EXAMPLE, MARK_EXAMPLE, NO_SUBSCRIBER, feed_query, mark_of
from digest import feed, seen

log = logging.getLogger("app.web.api.feed_browser")

_ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID"


def cors_headers(request: Request) -> dict:
    origin = request.headers.get("origin")
    if not origin:
        return {}
    if origin in config.get().feed_allowed_origins:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    return {"Vary": "Origin"}


def with_cors(endpoint):
    """CORS headers on every answer of a feed route, errors included (so the page can read a 401),
    and the preflight (OPTIONS) answered here: 204, with the CORS headers for an allowed origin only."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request):
        cors = cors_headers(request)
        if request.method == "OPTIONS":
            if "Access-Control-Allow-Origin" not in cors:
                return Response(status_code=204, headers=cors)  # no CORS headers: the browser refuses
            return Response(
                status_code=204,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "GET, POST",
                    "Access-Control-Allow-Headers": _ALLOW_HEADERS,
                    "Access-Control-Max-Age": "600",
                },
            )
        try:
            response = await endpoint(request)
        except ApiError as exc:
            exc.headers = {**(exc.headers or {}), **cors}
            raise
        response.headers.update(cors)
        return response

    return wrapped


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


async def feed_subscriber(request: Request) -> feed.Subscriber:
    """The subscriber a request's feed token names; 401 for anything else."""
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    if kind.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing feed token: send 'Authorization: Bearer <feed token>'")
    claims = tokens.verify_feed(token.strip(), time.time())
    if claims is None:
        raise _unauthorized("invalid or expired feed token")
    subscriber = await run_in_threadpool(feed.find, None, claims.subscriber_id)
    if subscriber is None or subscriber.token_version != claims.token_version:
        raise _unauthorized("invalid or expired feed token")
    return subscriber


# -- minting (server side, admin key) --------------------------------------------------------------
def token_ttl(request: Request, params: dict) -> tuple[int, list[dict]]:
    """The token's lifetime in seconds: FEED_TOKEN_SECONDS, or less when `ttl_seconds` asks for less."""
    ttl = config.get().feed_token_seconds
    if "ttl_seconds" in params:
        asked = params["ttl_seconds"]
        if not (asked.isascii() and asked.isdigit() and len(asked) <= 18 and int(asked) >= 1):
            return ttl, [problem("ttl_seconds", "must be a whole number of seconds, >= 1")]
        ttl = min(ttl, int(asked))  # asking for more gets FEED_TOKEN_SECONDS
    return ttl, []


async def post_feed_token(request: Request, user_id: str, query: int):
    ttl = query
    subscriber = await run_in_threadpool(feed.find, user_id)
    if subscriber is None:
        raise NotFound(NO_SUBSCRIBER)
    expires_at = int(time.time()) + ttl
    token = tokens.feed_token(subscriber.id, subscriber.token_version, expires_at)
    return FastJSONResponse({"token": token, "expires_at": expires_at}, status_code=201)


# -- the front end's routes (feed token) -----------------------------------------------------------
async def get_own_feed(request: Request, query: dict):
    subscriber = request.state.principal  # the feed token's (feed_subscriber, declared below)
    return FastJSONResponse(await run_in_threadpool(lambda: feed.page(subscriber, **query)))


async def _mark_own(request: Request, kind: str, mark: seen.MarkInput) -> Response:
    subscriber = request.state.principal
    if not await run_in_threadpool(seen.mark_user, None, kind, mark, subscriber.id):
        raise _unauthorized("invalid or expired feed token")  # erased meanwhile
    return Response(status_code=202)


async def post_own_seen(request: Request, body: seen.MarkInput):
    return await _mark_own(request, seen.SEEN, body)


async def post_own_read(request: Request, body: seen.MarkInput):
    return await _mark_own(request, seen.READ, body)


class Slots:
    """Open streams of this process (the event loop's thread only: no lock needed)."""

    def __init__(self):
        self.open = 0

    def take(self, limit: int) -> bool:
        if self.open >= limit:
            return False
        self.open += 1
        return True

    def give(self) -> None:
        self.open -= 1


slots = Slots()


class _Stream(StreamingResponse):
    """Gives its slot back however the response ends (finished, client gone, cancelled), even when
    the body never started."""

    def __init__(self, content, release, **kwargs):
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _message(head: feed.Head, items: list[dict], retry_ms: int | None = None) -> bytes:
    data = {"unseen_count": head.unseen_count, "unread_count": head.unread_count, "items": items}
    first = f"retry: {retry_ms}\n" if retry_ms else ""
    return f"{first}id: {head.newest_event_id}\nevent: feed\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


async def _new_items(subscriber: feed.Subscriber, after_id: int) -> list[dict]:
    page = await run_in_threadpool(lambda: feed.page(subscriber, limit=feed.MAX_LIMIT))
    return [item for item in page["items"] if item["latest_event_id"] > after_id]


class Watch:
    """One open stream's view of its subscriber: the last fingerprint seen, and a flag the watcher
    raises when it moved."""

    def __init__(self, subscriber_id: int, fingerprint: tuple | None):
        self.subscriber_id = subscriber_id
        self.fingerprint = fingerprint
        self.changed = asyncio.Event()


class Watcher:
    """One poller per process (per event loop) for every open stream: every FEED_STREAM_POLL_SECONDS
    one statement reads the fingerprints of all their subscribers (digest/feed.py), and the streams
    whose fingerprint moved are woken. It runs while streams are open."""

    def __init__(self):
        self.watches: set[Watch] = set()
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, watch: Watch) -> None:
        self.watches.add(watch)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.loop is not loop:
            self.loop, self.task = loop, loop.create_task(self._run())

    def remove(self, watch: Watch) -> None:
        self.watches.discard(watch)

    async def _run(self) -> None:
        while self.watches and not shutdown.requested.is_set():
            await asyncio.sleep(max(0.01, config.get().feed_stream_poll_seconds))
            watches = list(self.watches)
            try:
                prints = await run_in_threadpool(feed.fingerprints, sorted({w.subscriber_id for w in watches}))
            except Exception:
                log.warning("feed streams: fingerprints not read; trying again", exc_info=True)
                continue
            for w in watches:
                now = prints.get(w.subscriber_id)
                if now != w.fingerprint:
                    w.fingerprint = now
                    w.changed.set()


watcher = Watcher()


async def stream_messages(subscriber: feed.Subscriber, last_event_id: int | None):
    """The stream's messages: the counts are recomputed only when the watcher saw the subscriber's
    fingerprint move. The stream ends when the subscriber is erased or their token version moves
    (the token is revoked)."""
    heartbeat = max(0.01, config.get().feed_stream_heartbeat_seconds)
    prints = await run_in_threadpool(feed.fingerprints, [subscriber.id])
    watch = Watch(subscriber.id, prints.get(subscriber.id))
    watcher.add(watch)
    try:
        head = await run_in_threadpool(feed.head, subscriber)
        # Reconnecting: what happened since the client's last message, at once. Otherwise the
        # counts (the page reads the items with GET /v1/feed).
        missed = [] if last_event_id is None else await _new_items(subscriber, last_event_id)
        yield _message(head, missed, retry_ms=3000)
        quiet_since = time.monotonic()
        while not shutdown.requested.is_set():
            try:
                await asyncio.wait_for(watch.changed.wait(), max(0.0, quiet_since + heartbeat - time.monotonic()))
            except TimeoutError:
                yield b": heartbeat\n\n"
                quiet_since = time.monotonic()
                continue
            watch.changed.clear()
            if watch.fingerprint is None or watch.fingerprint[-1] != subscriber.token_version:
                return  # erased, or every token revoked
            now_head = await run_in_threadpool(feed.head, subscriber)
            if now_head != head:
                grew = now_head.newest_event_id > head.newest_event_id
                new = await _new_items(subscriber, head.newest_event_id) if grew else []
                head = now_head
                yield _message(head, new)
                quiet_since = time.monotonic()
    finally:
        watcher.remove(watch)


async def get_own_stream(request: Request):
    subscriber = request.state.principal
    raw = request.headers.get("last-event-id", "").strip()
    last = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None
    if not slots.take(max(0, config.get().feed_stream_max_connections)):
        raise ApiError(503, "busy", "too many open feed streams here; retry later", headers={"Retry-After": "5"})
    return _Stream(
        stream_messages(subscriber, last),
        slots.give,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class FeedTokenQuery(Body):
    """POST /v1/subscribers/{user_id}/feed-token: the query (documented from here)."""

    model_config = {**Body.model_config, "strict": False}  # query values arrive as text
    ttl_seconds: Annotated[
        int | None, Field(ge=1, le=10**17, description="at most FEED_TOKEN_SECONDS (more gets that)")
    ] = None


# The preflight: 204 with the CORS headers for an allowed origin, 204 without them for any other
# (which the browser then refuses).
_PREFLIGHT = Operation(
    "CORS preflight (FEED_ALLOWED_ORIGINS)",
    {204: "the CORS headers, for an allowed origin"},
    example=Example(
        answers={
            204: Answer(
                headers={
                    "Access-Control-Allow-Origin": "http://127.0.0.1:8026",
                    "Access-Control-Allow-Methods": "GET, POST",
                    "Access-Control-Allow-Headers": _ALLOW_HEADERS,
                    "Access-Control-Max-Age": "600",
                }
            )
        }
    ),
)
_TOKEN_ONLY = "With `Authorization: Bearer <feed token>`: an API key is refused (401)."


def _own_route(path: str, endpoint: Endpoint, method: str, operation: Operation) -> Route:
    """A route of the feed token's own feed: the token authenticates it, CORS wraps it."""
    declared: dict[str, Any] = {
        method: replace(operation, bearer=True, description=_TOKEN_ONLY, authenticate=feed_subscriber)
    }
    return api_route(path, endpoint, options=_PREFLIGHT, wrap=with_cors, **declared)


def _own_mark_route(state: str, endpoint: Endpoint) -> Route:
    summary = f"Mark entities (or everything) {state} in the feed token's own feed"
    marked = Operation(
        summary,
        {202: "committed"},
        errors=(400, 413, 422),
        body=seen.MarkInput,
        check=mark_of,
        example=Example(request=MARK_EXAMPLE),
    )
    return _own_route(f"/v1/feed/{state}", endpoint, "post", marked)


# One message of the stream, as _message writes it (the feed after a second cheer arrived).
STREAM_EXAMPLE = (
    "id: 2\nevent: feed\ndata: "
    + orjson.dumps({key: FEED_EXAMPLE[key] for key in ("unseen_count", "unread_count", "items")}).decode()
    + "\n\n"
)

routes = [
    api_route(
        "/v1/subscribers/{user_id:str}/feed-token",
        post_feed_token,
        path_params={"user_id": _USER_ID},
        post=Operation(
            "Mint a short-lived feed token for a subscriber's front end: {token, expires_at}",
            {201: "the token and its expiry (Unix seconds)"},
            errors=(404, 422),
            query=FeedTokenQuery,
            check_query=token_ttl,
            scope="admin",
            example=Example(
                {"user_id": "you", "ttl_seconds": 3600},
                answers={
                    201: {"token": "djE6MToxOmV4cDoxNzk1ODgzNzEx.yiq0L68pzXeqwUu-wCmMRA", "expires_at": 1795883711}
                },
            ),
        ),
    ),
    _own_route(
        "/v1/feed",
        get_own_feed,
        "get",
        Operation(
            "The feed token's own feed (as GET /v1/subscribers/{user_id}/feed)",
            {200: FEED_ANSWER},
            errors=(422,),
            query=feed.FeedQuery,
            check_query=feed_query,
            example=Example({"limit": 20}, answers={200: FEED_EXAMPLE}),
        ),
    ),
    _own_mark_route("seen", post_own_seen),
    _own_mark_route("read", post_own_read),
    _own_route(
        "/v1/feed/stream",
        get_own_stream,
        "get",
        Operation(
            "Server-Sent Events (text/event-stream): count changes and new items of the feed token's own feed",
            {200: "the stream"},
            errors=(503,),
            example=Example(answers={200: Answer("text/event-stream", STREAM_EXAMPLE)}),
        ),
    ),
]
