"""GET /v/{token}: a sent digest in the browser ("View in your browser" in every digest).

The token (purpose "view", scope "run:<id>") is signed and bound to token_version like the
unsubscribe link, so it works exactly as long as that one. Anything else — a forged, revoked or
malformed token, another subscriber's run, a run never sent — gets the 404 page; a run whose
events retention already dropped gets a 410 page that says so. The copy itself is rendered by
digest/hosted.py: direct links, no open pixel. Its CSP allows the mail's inline styles and https
images and nothing else (no script at all).
"""

from __future__ import annotations

import html as html_lib
import logging
import re

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from app.platform import config, tokens
from app.platform.i18n import N_
from app.web.pages import common, schedule
from digest import hosted

log = logging.getLogger("app.web.pages.view")

HEADERS = {
    **common.SECURITY_HEADERS,
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src https: data:; "
        "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
}
_BODY_START = re.compile(r"<body\b[^>]*>", re.IGNORECASE)
_NOTE_STYLE = "margin:0;padding:8px 16px;font:12px/18px sans-serif;color:#52606d;text-align:center"


async def view_page(request: Request) -> Response:
    token = request.path_params["token"]
    found = await common.subscriber_for("view", token)
    run_id = tokens.run_id(found[1]) if found else None
    if found is None or run_id is None:
        return common.not_found(request)
    subscriber = found[0]
    result = await run_in_threadpool(hosted.render, run_id, subscriber)
    if result is None:
        return common.not_found(request)
    t = common.translator_for(request, subscriber)
    sent = schedule.when(result.sent_at, subscriber["timezone"], t)
    if isinstance(result, hosted.Gone):
        days = config.get().retention_days
        gone = (
            N_(
                "This digest was sent on {sent}. We keep what digests show for {days} days, and this one is "
                "older, so it cannot be shown any more. Your newer digests are in your inbox."
            )
            if days
            else N_(
                "This digest was sent on {sent}. What it showed is no longer stored, so it cannot be shown "
                "any more. Your newer digests are in your inbox."
            )
        )
        title = N_("This digest is no longer available")
        return common.error_page(request, 410, title, gone, subscriber=subscriber, values={"sent": sent, "days": days})
    note = f'<p style="{_NOTE_STYLE}">{html_lib.escape(t.gettext("This digest was sent on {sent}.", sent=sent))}</p>'
    html = _BODY_START.sub(lambda m: m.group(0) + note, result.html, count=1)
    return HTMLResponse(html, headers=HEADERS)
