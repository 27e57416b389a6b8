"""Naive baseline for scripts/bench/click.py: the obvious click endpoint, for comparison only.

A synchronous endpoint (Starlette runs it in its threadpool) that looks the link up and inserts
the history row with one DB round trip each, per request. Same code check, same redirect.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform import db
from app.web import health
from tracking import codes


def click(request: Request) -> Response:
    decoded = codes.decode_click(request.path_params["code"])
    if decoded is None:
        return Response(status_code=404)
    rows = db.query("SELECT url, mail_kind, mail_id FROM email_links WHERE id = %s", (decoded.link_id,))
    if not rows:
        return Response(status_code=404)
    url, kind, mail_id = rows[0]
    db.query(
        "INSERT INTO email_link_history (kind, link_id, mail_kind, mail_id, subscriber_id, ip, user_agent) "
        "VALUES ('click', %s, %s, %s, %s, %s, %s)",
        (
            decoded.link_id,
            kind,
            mail_id,
            decoded.subscriber_id,
            request.client.host if request.client else None,
            request.headers.get("user-agent"),
        ),
    )
    return Response(status_code=302, headers={"Location": url})


db.init()
naive_app = Starlette(routes=[Route("/c/{code}", click, methods=["GET"]), *health.routes])
