"""Subscriber pages: the preference centre, the unsubscribe page and a sent digest in the browser
(server-rendered, no JS).

Routes: GET/POST /preferences/{token}, GET/POST /u/{token}, GET /v/{token} (a sent digest in the
browser), and /static for their stylesheet.
"""

from __future__ import annotations

from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from app.web.pages import common
from app.web.pages.preferences import preferences_page, preferences_submit
from app.web.pages.unsubscribe import unsubscribe_page, unsubscribe_submit
from app.web.pages.view import view_page

routes = [
    Route("/preferences/{token:str}", preferences_page, methods=["GET"]),
    Route("/preferences/{token:str}", preferences_submit, methods=["POST"]),
    Route("/u/{token:str}", unsubscribe_page, methods=["GET"]),
    Route("/u/{token:str}", unsubscribe_submit, methods=["POST"]),
    Route("/v/{token:str}", view_page, methods=["GET"]),
    Mount("/static", StaticFiles(directory=str(common.STATIC_DIR)), name="static"),
]
