"""The project's icon on every page it serves — the app, the development mail viewer and the feed
demo: each answers /favicon.ico with it (a browser asks for that even when a page names no icon, and
a 404 there is noise in every log), and their pages link it. Here, not in app.web: the development
servers import it without building the web app."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<rect width="32" height="32" rx="7" fill="#1f4e8c"/>'
    b'<path d="M6 10h20v13H6z" fill="#fff"/>'
    b'<path d="M6 10l10 8 10-8" fill="none" stroke="#1f4e8c" stroke-width="2" stroke-linejoin="round"/>'
    b'<circle cx="25" cy="9" r="5" fill="#f5a623" stroke="#1f4e8c" stroke-width="1.5"/>'
    b"</svg>"
)
LINK = '<link rel="icon" type="image/svg+xml" href="/favicon.ico">'


def favicon(request: Request) -> Response:
    return Response(ICON, media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"})


route = Route("/favicon.ico", favicon, methods=["GET"])
