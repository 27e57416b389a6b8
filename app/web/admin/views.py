"""The operator dashboard's endpoints (server-rendered, no JavaScript).

  GET  /admin                      figures and charts (?range=24h|7d), latest newsletters, and each
                                   mail provider's circuit breaker when MAIL_PROVIDERS names several
  GET  /admin/charts/{name}.svg    one chart (?range=…), image/svg+xml
  GET  /admin/newsletters          every newsletter with its send progress (?page=)
  GET  /admin/suppressions         the suppression list (?q=, ?page=)
  POST /admin/suppressions/add     suppress an address (audited)
  GET  /admin/suppressions/{id}/remove   confirmation page;  POST: remove (audited)
  POST /admin/sending/stop         the emergency stop for all outgoing mail (reason required; audited)
  POST /admin/sending/resume       release it (audited)
  GET  /admin/login, POST /admin/login, POST /admin/logout

Every signed-in page shows a banner while all mail is stopped.

Signed out, a page redirects to the sign-in form (303), a chart answers 401, a POST redirects too
and changes nothing. Every POST carries a CSRF token (403 without a valid one, nothing changed):
the sign-in form's is bound to the csrf cookie, the others to the session. Bad query parameters
answer 400 naming the parameter.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from app.operations import audit, sending
from app.operations.suppressions import add_suppression, remove_suppression
from app.platform import apikeys, config, mail_stop
from app.platform.errors import Invalid
from app.platform.providers import failover
from app.platform.validation import plain_int
from app.web.admin import charts, newsletters, render, session, stats, suppressions, throttle
from app.web.pages import common, csrf
from tracking.machines import client_ip

log = logging.getLogger("app.web.admin")

FAILED_LOGIN_DELAY_SECONDS = 1.0
MAX_KEY_CHARS = 300
NOTICES = {
    "removed": "The address was removed from the suppression list. The change is recorded in the audit log below.",
    "already-removed": "That address was no longer on the suppression list: nothing changed.",
    "added": "The address is on the suppression list: no mail goes to it from the next send on. "
    "The change is recorded in the audit log below.",
    "already-suppressed": "That address was on the suppression list already: it keeps its reason.",
    "stopped": "All outgoing mail is stopped. Every sender stops within a second; nothing is lost.",
    "resumed": "Sending resumed: due digests go out at the next scheduler tick, newsletters continue "
    "where they stopped.",
}


def _client(request: Request) -> str | None:
    return client_ip(request.headers.get("x-forwarded-for"), request.client.host if request.client else None)


def _operator(request: Request, current: session.AdminSession) -> audit.Operator:
    return audit.Operator(current.key_name, current.key_id, _client(request), current.id)


def signed_in(endpoint):
    """Endpoint decorator: called as (request, current session); signed out → sign-in form."""

    @functools.wraps(endpoint)
    async def handler(request: Request) -> Response:
        token = session.token_from_cookie(request)
        current = await run_in_threadpool(session.lookup, token) if token else None
        if current is None:
            if request.url.path.startswith("/admin/charts/"):
                return Response(status_code=401, headers=common.SECURITY_HEADERS)
            return render.redirect("/admin/login")
        if not request.url.path.startswith("/admin/charts/"):
            request.state.mail_stop = await run_in_threadpool(mail_stop.state)  # the banner
        return await endpoint(request, current)

    return handler


def posted(unchanged: str = "nothing changed.", logged: str | None = None):
    """Endpoint decorator under signed_in: called as (request, current session, posted form) once the
    form is readable (else 400) and carries this session's CSRF token (else 403, whose page ends
    "…so " + `unchanged`; logged as `logged` refused when that is given)."""

    def decorate(endpoint):
        @functools.wraps(endpoint)
        async def handler(request: Request, current) -> Response:
            try:
                form = await common.read_form(request)
            except (common.FormTooLarge, common.BadForm):
                return render.error(request, 400, "Bad request", "That request could not be read.", current)
            if not render.csrf_ok(current, common.text(form, csrf.FIELD)):
                if logged:
                    log.info("%s refused: bad CSRF token (session %s)", logged, current.id)
                return render.error(
                    request,
                    403,
                    "Please try again",
                    f"This form expired or was sent from somewhere else, so {unchanged}",
                    current,
                )
            return await endpoint(request, current, form)

        return handler

    return decorate


class BadParam(ValueError):
    pass


def _page_param(request: Request, limit: int) -> int:
    number = plain_int(request.query_params.get("page", "1"), 6)
    if number is None or not 1 <= number <= limit:
        raise BadParam(f"page must be a whole number from 1 to {limit}")
    return number


def _range_param(request: Request) -> str:
    name = request.query_params.get("range", stats.DEFAULT_RANGE)
    if name not in stats.RANGES:
        raise BadParam(f"range must be one of {', '.join(stats.RANGES)}")
    return name


def _bad_param(request: Request, current, exc: BadParam) -> Response:
    return render.error(request, 400, "Bad request", str(exc), current)


# -- sign-in ---------------------------------------------------------------------------------------


def _login_page(
    request: Request, error: str | None = None, status_code: int = 200, headers: dict | None = None
) -> Response:
    token, fresh = csrf.issue(request, 0, render.LOGIN_CSRF_PURPOSE)
    context = {"error": error, "login_csrf": token, "development": config.get().env == "development"}
    response = render.page(request, "login.html", context, None, status_code, headers)
    csrf.set_cookie(response, fresh)
    return response


async def login_page(request: Request) -> Response:
    token = session.token_from_cookie(request)
    if token and (await run_in_threadpool(session.lookup, token)) is not None:
        return render.redirect("/admin")
    return _login_page(request)


async def login_submit(request: Request) -> Response:
    try:
        form = await common.read_form(request)
    except (common.FormTooLarge, common.BadForm):
        return _login_page(request, "That request could not be read.", 400)
    if not csrf.valid(request, 0, common.text(form, csrf.FIELD), render.LOGIN_CSRF_PURPOSE):
        return render.error(
            request,
            403,
            "Please try again",
            "This sign-in form expired or was sent from somewhere else. Open it again and retry.",
        )
    client = _client(request)
    wait = await run_in_threadpool(throttle.admit, client)  # counted before the key is looked at
    if wait:
        minutes = max(1, round(wait / 60))
        return _login_page(
            request,
            f"Too many failed sign-ins from your address. Try again in about "
            f"{minutes} minute{'s' if minutes != 1 else ''}.",
            429,
            {"Retry-After": str(wait)},
        )
    key = (common.text(form, "api_key") or "").strip()
    principal = None
    if key and len(key) <= MAX_KEY_CHARS:
        principal = await run_in_threadpool(apikeys.cache.lookup, key)
    if principal is None or principal.scope != "admin":
        log.warning("failed /admin sign-in from %s", client)
        await asyncio.sleep(FAILED_LOGIN_DELAY_SECONDS)  # slows a scripted guesser; holds no thread
        return _login_page(request, "That is not a valid admin API key (unknown, revoked, or not of scope admin).", 401)
    await run_in_threadpool(throttle.succeeded, client)
    cookie = await run_in_threadpool(session.start, principal.key_id, client, request.headers.get("user-agent"))
    log.info("/admin sign-in with API key %s (%s) from %s", principal.key_id, principal.name, client)
    response = render.redirect("/admin")
    session.set_cookie(response, request, cookie)
    return response


@signed_in
@posted("you are still signed in.")
async def logout(request: Request, current, form) -> Response:
    await run_in_threadpool(session.end, current.id)
    response = render.redirect("/admin/login")
    session.clear_cookie(response, request)
    return response


# -- dashboard -------------------------------------------------------------------------------------


@signed_in
async def dashboard(request: Request, current) -> Response:
    try:
        range_name = _range_param(request)
    except BadParam as exc:
        return _bad_param(request, current, exc)
    data = await run_in_threadpool(stats.cache.get, range_name)
    latest, _ = await run_in_threadpool(newsletters.page, 1, 5)
    mail_providers = await run_in_threadpool(failover.status)  # what `notify providers` prints
    return render.page(
        request,
        "dashboard.html",
        {
            "section": "dashboard",
            "d": data,
            "range_name": range_name,
            "ranges": stats.RANGE_LABELS,
            "charts": [(name, charts.TITLES[name], render.describe(name, data)) for name in charts.CHARTS],
            "newsletters": latest,
            "providers": render.breakers(mail_providers) if len(mail_providers) > 1 else [],
            "breaker_window": config.get().provider_breaker_window_seconds,
            "fmt": render,
            "notice": NOTICES.get(request.query_params.get("notice", "")),
        },
        current,
    )


@signed_in
async def chart(request: Request, current) -> Response:
    name = request.path_params["name"]
    if name not in charts.CHARTS:
        return Response(status_code=404, headers=common.SECURITY_HEADERS)
    try:
        range_name = _range_param(request)
    except BadParam as exc:
        return Response(str(exc), status_code=400, media_type="text/plain", headers=common.SECURITY_HEADERS)
    data = await run_in_threadpool(stats.cache.get, range_name)
    body = await run_in_threadpool(charts.svg, name, data)
    return Response(
        body,
        media_type="image/svg+xml",
        headers={
            **common.SECURITY_HEADERS,
            "Cache-Control": "private, no-store",
            # Opened directly, the SVG may use its own <style>, nothing else.
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'self'",
            "X-Frame-Options": "SAMEORIGIN",
        },
    )


@signed_in
async def newsletter_list(request: Request, current) -> Response:
    try:
        number = _page_param(request, newsletters.MAX_PAGE)
    except BadParam as exc:
        return _bad_param(request, current, exc)
    rows, has_next = await run_in_threadpool(newsletters.page, number)
    return render.page(
        request,
        "newsletters.html",
        {
            "section": "newsletters",
            "rows": rows,
            "page_number": number,
            "has_next": has_next,
            "fmt": render,
        },
        current,
    )


# -- suppressions ----------------------------------------------------------------------------------


@signed_in
async def suppression_list(request: Request, current) -> Response:
    try:
        number = _page_param(request, suppressions.MAX_PAGE)
        query = suppressions.clean_text(request.query_params.get("q"), "q", suppressions.MAX_SEARCH_CHARS)
    except BadParam as exc:
        return _bad_param(request, current, exc)
    except suppressions.BadInput as exc:
        return await _suppressions_page(request, current, {"search_error": f"Search: {exc.message}."}, 400)
    notice = NOTICES.get(request.query_params.get("notice", ""))
    return await _suppressions_page(request, current, {"query": query, "page_number": number, "notice": notice})


async def _suppressions_page(request: Request, current, context: dict, status_code: int = 200) -> Response:
    """The list (page `page_number` of what `query` finds), the add form and the audit log."""
    query, number = context.get("query", ""), context.get("page_number", 1)
    rows, has_next = (
        ([], False) if "search_error" in context else await run_in_threadpool(suppressions.search, query, number)
    )
    recent = await run_in_threadpool(audit.recent)
    return render.page(
        request,
        "suppressions.html",
        {
            "section": "suppressions",
            "rows": rows,
            "query": query,
            "page_number": number,
            "has_next": has_next,
            "search_error": None,
            "add_error": None,
            "add_email": "",
            "add_note": "",
            "audit": recent,
            "fmt": render,
            **context,
        },
        current,
        status_code,
    )


@signed_in
@posted("nothing changed. Open the suppression list again and retry.", logged="suppression add")
async def suppression_add(request: Request, current, form) -> Response:
    typed = {
        "add_email": (common.text(form, "email") or "")[: suppressions.MAX_SEARCH_CHARS],
        "add_note": (common.text(form, "note") or "")[: suppressions.MAX_NOTE_CHARS],
    }
    try:
        address = suppressions.clean_text(common.text(form, "email"), "email", suppressions.MAX_SEARCH_CHARS)
        note = suppressions.clean_text(common.text(form, "note"), "note", suppressions.MAX_NOTE_CHARS)
        row, added = await run_in_threadpool(add_suppression, _operator(request, current), address, note)
    except suppressions.BadInput as exc:
        return await _add_refused(request, current, typed, exc.field, exc.message)
    except Invalid as exc:  # not an address
        return await _add_refused(request, current, typed, "email", str(exc.problems[0]["message"]))
    log.info("%s suppressed by API key %s (%s); added: %s", row.email, current.key_id, current.key_name, added)
    return render.redirect(f"/admin/suppressions?notice={'added' if added else 'already-suppressed'}")


async def _add_refused(request: Request, current, typed: dict, field: str, message: str) -> Response:
    error = f"{'Address' if field == 'email' else 'Note'}: {message}. Nothing changed."
    return await _suppressions_page(request, current, {"add_error": error, **typed}, 422)


def _suppression_id(request: Request) -> int | None:
    raw = request.path_params["id"]
    return raw if 0 < raw < 2**63 else None


@signed_in
async def suppression_confirm(request: Request, current) -> Response:
    sid = _suppression_id(request)
    row = await run_in_threadpool(suppressions.get, sid) if sid else None
    if row is None:
        return render.redirect("/admin/suppressions?notice=already-removed")
    return render.page(
        request,
        "suppression_remove.html",
        {"section": "suppressions", "row": row, "error": None, "note": "", "fmt": render},
        current,
    )


@signed_in
@posted("nothing changed. Open the suppression list again and retry.", logged="suppression removal")
async def suppression_remove(request: Request, current, form) -> Response:
    sid = _suppression_id(request)
    row = await run_in_threadpool(suppressions.get, sid) if sid else None
    if sid is None or row is None:
        return render.redirect("/admin/suppressions?notice=already-removed")
    try:
        note = suppressions.clean_text(common.text(form, "note"), "note", suppressions.MAX_NOTE_CHARS)
    except suppressions.BadInput as exc:
        return render.page(
            request,
            "suppression_remove.html",
            {
                "section": "suppressions",
                "row": row,
                "error": f"Note: {exc.message}.",
                "note": (common.text(form, "note") or "")[: suppressions.MAX_NOTE_CHARS],
                "fmt": render,
            },
            current,
            422,
        )
    removed = await run_in_threadpool(remove_suppression, _operator(request, current), sid, note)
    if removed is None:
        return render.redirect("/admin/suppressions?notice=already-removed")
    log.info("suppression %s removed by API key %s (%s)", sid, current.key_id, current.key_name)
    return render.redirect("/admin/suppressions?notice=removed")


# -- the emergency stop ----------------------------------------------------------------------------


@signed_in
@posted()
async def sending_stop(request: Request, current, form) -> Response:
    reason = (common.text(form, "reason") or "").strip()
    if not reason or len(reason) > sending.MAX_REASON_CHARS or not reason.isprintable():
        return render.error(
            request,
            422,
            "A reason is needed",
            f"Say in one line (at most {sending.MAX_REASON_CHARS} characters) why all mail is "
            "stopped: the next operator reads it on the dashboard. Nothing changed.",
            current,
        )
    await run_in_threadpool(sending.stop_sending, _operator(request, current), reason)
    log.warning(
        "all outgoing mail stopped from /admin by API key %s (%s): %s", current.key_id, current.key_name, reason
    )
    return render.redirect("/admin?notice=stopped")


@signed_in
@posted()
async def sending_resume(request: Request, current, form) -> Response:
    await run_in_threadpool(sending.resume_sending, _operator(request, current))
    log.warning("sending resumed from /admin by API key %s (%s)", current.key_id, current.key_name)
    return render.redirect("/admin?notice=resumed")
