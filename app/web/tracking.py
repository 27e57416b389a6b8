"""Public tracking endpoints: GET/HEAD /c/{code} (click redirect) and /o/{code}.gif (open pixel).

Hot paths: no database round trip per request. The code is checked with an HMAC in process, the
link row comes from an in-process cache (rows are immutable), the history row goes to a buffer
written in batches (tracking/recorder.py; bounded loss window TRACKING_FLUSH_SECONDS on SIGKILL,
nothing lost on SIGTERM). The redirect target is always the email_links row: nothing in the URL
can choose where we send the browser. Unknown or forged codes get a 404 page and no redirect.

Both endpoints are plain ASGI callables rather than Request/Response endpoints: they read two
headers and answer with a fixed set, and skipping the wrappers is a sizeable share of the per-click
CPU at 10k clicks/s.
"""

from __future__ import annotations

import base64
import logging

from starlette.responses import Response

from app.platform import db, metrics
from app.platform.openapi import Answer, Example, Operation, api_route
from tracking import codes, machines, recorder, resolve

log = logging.getLogger("app.web.tracking")

MAX_USER_AGENT = 512
MAX_FORWARDED_FOR = 2048
PIXEL_GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_STORE = b"no-store, private"
_NOT_FOUND_HTML = (
    b'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Link not found</title>'
    b'<meta name="robots" content="noindex"></head><body style="font-family:sans-serif;max-width:32em;'
    b'margin:4em auto"><h1>This link does not work</h1><p>The link you followed is not valid. If you '
    b"copied it from an email, make sure you copied all of it.</p></body></html>"
)
_NOT_FOUND_START = {
    "type": "http.response.start",
    "status": 404,
    "headers": [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(_NOT_FOUND_HTML)).encode()),
        (b"cache-control", _NO_STORE),
    ],
}
_EMPTY_BODY = {"type": "http.response.body", "body": b""}
_PIXEL_HEADERS = [
    (b"content-type", b"image/gif"),
    (b"content-length", str(len(PIXEL_GIF)).encode()),
    (b"cache-control", _NO_STORE),
]


def _request_facts(scope) -> tuple[str | None, str | None]:
    """(client ip, user agent) from the raw ASGI scope."""
    ua = forwarded = None
    for name, value in scope["headers"]:
        if name == b"user-agent":
            ua = value[:MAX_USER_AGENT].decode("latin-1")
        elif name == b"x-forwarded-for":
            # Repeated headers are one list in order (RFC 9110 5.3): a proxy may add its own line.
            hops = value[-MAX_FORWARDED_FOR:].decode("latin-1")  # the right end is what proxies added
            forwarded = hops if forwarded is None else f"{forwarded}, {hops}"
    client = scope.get("client")
    return machines.client_ip(forwarded, client[0] if client else None), ua


async def _send(send, start: dict, body: bytes) -> None:
    await send(start)
    await send({"type": "http.response.body", "body": body})


async def not_found(send, head: bool = False) -> None:
    await _send(send, _NOT_FOUND_START, b"" if head else _NOT_FOUND_HTML)


async def _unavailable(scope, receive, send) -> None:
    await Response(
        "Temporarily unavailable, try again shortly.",
        status_code=503,
        headers={"Retry-After": "5", "Cache-Control": "no-store"},
    )(scope, receive, send)


async def click(scope, receive, send) -> None:
    code = scope["path_params"]["code"]
    head = scope["method"] == "HEAD"
    try:
        target = await resolve.click_target(code)
    except db.UNAVAILABLE as exc:
        # Only a first sighting of a link touches the DB; if that fails we cannot know the target.
        log.warning("click code lookup failed, database unavailable: %s", str(exc).strip().splitlines()[:1])
        await _unavailable(scope, receive, send)
        return
    except Exception:
        log.exception("click code lookup failed")
        await _unavailable(scope, receive, send)
        return
    if target is None:
        await not_found(send, head)
        return
    ip, ua = _request_facts(scope)
    reason = machines.classify_click(scope["method"], ua)
    link = target.link
    recorder.record("click", link.id, link.mail_kind, link.mail_id, target.subscriber_id, ip, ua, reason)
    metrics.tracking_hit("click", reason is not None)
    await send(
        {
            "type": "http.response.start",
            "status": 302,
            "headers": [
                (b"location", link.location),
                (b"content-length", b"0"),
                (b"cache-control", _NO_STORE),
                (b"referrer-policy", b"no-referrer"),
            ],
        }
    )
    await send(_EMPTY_BODY)


async def open_pixel(scope, receive, send) -> None:
    decoded = codes.decode_open(scope["path_params"]["code"])
    if decoded is not None:
        ip, ua = _request_facts(scope)
        reason = machines.classify_open(scope["method"], ua, ip)
        recorder.record("open", None, decoded.mail_kind, decoded.mail_id, decoded.subscriber_id, ip, ua, reason)
        metrics.tracking_hit("open", reason is not None)
    # A broken image would show in the mail: answer with the pixel even for a bad code (but 404).
    await _send(
        send,
        {"type": "http.response.start", "status": 200 if decoded else 404, "headers": _PIXEL_HEADERS},
        b"" if scope["method"] == "HEAD" else PIXEL_GIF,
    )


class _Asgi:
    """Starlette mounts a non-function endpoint as a raw ASGI app (path params in the scope)."""

    def __init__(self, fn):
        self.fn = fn

    async def __call__(self, scope, receive, send) -> None:
        await self.fn(scope, receive, send)


def on_shutdown() -> None:
    """Called by the web app's lifespan on graceful shutdown (SIGTERM): write the buffered history.
    (atexit is not enough: uvicorn re-raises SIGTERM after shutdown, which skips atexit.)"""
    recorder.recorder().flush_at_exit()


# The reference's examples: codes as tracking/codes.py makes them (link 1 and newsletter 1, for
# subscriber 1, signed with the development key).
CLICK_CODE_EXAMPLE = "1AQEdB9Wu19PXu8xu"
OPEN_CODE_EXAMPLE = "1bgEBqyhX9PLnvhVYVg"

routes = [
    api_route(
        "/c/{code}",
        _Asgi(click),
        path_params={"code": str},
        get=Operation(
            "Click redirect: 302 to the link's URL, 404 for unknown/forged codes",
            {302: "redirect", 404: "unknown"},
            example=Example(
                {"code": CLICK_CODE_EXAMPLE},
                answers={302: Answer(headers={"Location": "https://example.test/posts/p1"})},
            ),
        ),
    ),
    api_route(
        "/o/{code}.gif",
        _Asgi(open_pixel),
        path_params={"code": str},
        get=Operation(
            "Open pixel (1x1 GIF); the same pixel with 404 for unknown/forged codes",
            {200: "pixel", 404: "unknown code (still a pixel)"},
            example=Example({"code": OPEN_CODE_EXAMPLE}, answers={200: Answer("image/gif", "(43 bytes: a 1x1 GIF)")}),
        ),
    ),
]
