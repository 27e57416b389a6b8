"""GET/POST /u/{token}: unsubscribe confirmation page and RFC 8058 one-click unsubscribe.

- GET never changes anything (mail scanners and link previewers fetch every link): it shows the
  current state with one button — "Unsubscribe", or "Resubscribe" once unsubscribed.
- POST whose body carries `List-Unsubscribe=One-Click` (urlencoded or multipart, as mail clients
  send it): unsubscribes with no cookie, no auth, no CSRF, no redirect; answers 200 with a small page.
- POST `action=unsubscribe` from the page's button: unsubscribes, 303 back to the page. Not
  CSRF-checked on purpose: the signed token is the capability (exactly what RFC 8058 relies on), a
  cross-site forger could use the one-click form anyway, and a browser that blocks cookies must
  still be able to leave.
- POST `action=unsubscribe_all` from the page's second button: stops everything, as above.
- POST `action=resubscribe` / `resubscribe_all`: CSRF-checked (signed double-submit cookie), 303
  back to the page.

The token scope says what the link stops (app/subscribers/streams.py): a digest's link the digest stream, a
newsletter's the newsletter stream, "category:X" one topic, no scope everything. The page says
which, and always offers "everything" too.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.operations import opt_out
from app.platform import tokens
from app.platform.i18n import N_
from app.subscribers import streams
from app.web.pages import common, csrf, subscription

log = logging.getLogger("app.web.pages.unsubscribe")

ONE_CLICK_FIELD = "List-Unsubscribe"
ONE_CLICK_VALUE = "One-Click"


def _page_url(token: str) -> str:
    return f"/u/{quote(token, safe='')}"


def _state(subscriber: dict, claims: tokens.TokenClaims) -> dict:
    target = streams.target(claims.scope)
    return {
        "scope_kind": target.kind,
        "category": target.category,
        "what": streams.label(target),
        "scoped": target.kind != streams.EVERYTHING,
        "unsubscribed": subscription.is_stopped(subscriber, target),
        "everything_stopped": subscriber["unsubscribed_at"] is not None,
    }


@common.token_page("unsubscribe")
async def unsubscribe_page(request: Request, token: str, subscriber: dict, claims) -> Response:
    return common.form_page(
        request,
        "unsubscribe.html",
        {
            "subscriber": subscriber,
            **_state(subscriber, claims),
            "action_url": _page_url(token),
            "preferences_url": tokens.preferences_path(subscriber["id"], subscriber["token_version"]),
            "notice": request.query_params.get("notice")
            if request.query_params.get("notice") in ("unsubscribed", "resubscribed")
            else None,
        },
        subscriber,
    )


@common.token_page("unsubscribe")
async def unsubscribe_submit(request: Request, token: str, subscriber: dict, claims) -> Response:
    try:
        posted = await common.read_form(request)
    except common.FormTooLarge:
        return common.error_page(
            request, 413, N_("Request too large"), N_("That request was too large to process."), subscriber=subscriber
        )
    except common.BadForm:
        return common.error_page(
            request, 400, N_("Bad request"), N_("That request could not be read."), subscriber=subscriber
        )

    sid, version, scope = subscriber["id"], claims.token_version, claims.scope
    action = common.text(posted, "action")
    if common.text(posted, ONE_CLICK_FIELD) == ONE_CLICK_VALUE or action is None:
        # RFC 8058 one-click (a bare POST to the List-Unsubscribe URL counts too: only a mail
        # client or the user acts by POST; scanners GET). No redirect, no cookie.
        await run_in_threadpool(opt_out.unsubscribe, sid, version, scope)
        log.info("subscriber %s unsubscribed by one-click POST (scope=%s)", sid, scope)
        target = streams.target(scope)
        return common.render(
            request,
            "unsubscribed_oneclick.html",
            {"category": target.category, "scope_kind": target.kind, "email": subscriber["email"]},
            t=common.translator_for(request, subscriber),
        )

    if action in ("unsubscribe", "unsubscribe_all"):
        scope = scope if action == "unsubscribe" else None
        await run_in_threadpool(opt_out.unsubscribe, sid, version, scope)
        log.info("subscriber %s unsubscribed from the confirmation page (scope=%s)", sid, scope)
        notice = "unsubscribed"
    elif action in ("resubscribe", "resubscribe_all"):
        scope = scope if action == "resubscribe" else None
        if not csrf.valid(request, sid, common.text(posted, csrf.FIELD)):
            log.info("resubscribe for subscriber %s rejected: bad CSRF token", sid)
            return common.error_page(
                request,
                403,
                N_("Please try again"),
                N_(
                    "This form expired or was sent from somewhere else, so nothing changed. "
                    "Open the page again and resubmit."
                ),
                _page_url(token),
                subscriber,
            )
        await run_in_threadpool(opt_out.resubscribe, sid, version, scope)
        log.info("subscriber %s resubscribed (scope=%s)", sid, scope)
        notice = "resubscribed"
    else:
        return common.error_page(request, 400, N_("Bad request"), N_("Unknown action."), _page_url(token), subscriber)
    return common.back_to(_page_url(token), notice)
