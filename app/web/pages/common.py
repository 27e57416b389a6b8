"""Shared plumbing of the subscriber pages: templates, headers, bounded form reading, token lookup."""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import jinja2
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from app.platform import http, i18n, tokens
from app.subscribers import records
from app.web.pages import csrf

log = logging.getLogger("app.web.pages")

WEB_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"
# Forms here are a handful of short fields (the topic list is capped at 100): 64 KiB is generous.
MAX_FORM_BYTES = 64 * 1024
MAX_FORM_FIELDS = 400

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
    autoescape=True,  # every {{ }} is HTML-escaped: names and topic labels come from outside
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates = Jinja2Templates(env=_env)


def _css_url() -> str:
    # Content hash in the URL: the stylesheet can be cached for long and still update on deploy.
    try:
        digest = hashlib.sha256((STATIC_DIR / "pages.css").read_bytes()).hexdigest()[:10]
    except OSError:
        digest = "0"
    return f"/static/pages.css?v={digest}"


CSS_URL = _css_url()

# Token-bearing URLs must not leak through Referer, be cached by proxies, framed, or indexed.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "X-Robots-Tag": "noindex, nofollow",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}


def translator_for(request: Request, subscriber: dict | None = None) -> i18n.Translator:
    """The page's language: the subscriber's (their locale, else DEFAULT_LOCALE, as their mail);
    a page without one (an expired link) negotiates from Accept-Language."""
    if subscriber is not None:
        return i18n.translator(subscriber.get("locale"))
    return i18n.translator(i18n.negotiate(request.headers.get("accept-language")))


def words(t: i18n.Translator) -> dict:
    """What templates translate with: `gettext("…", name=value)` and `ngettext(…)`. The translation
    is HTML-escaped and the values filled in escaped too, unless they are Markup (`strong(email)`)."""

    def gettext(msgid: str, **values: object) -> Markup:
        return Markup(escape(t.translate(msgid))).format(**values)

    def ngettext(singular: str, plural: str, count: int, **values: object) -> Markup:
        text = t.translate_plural(singular, plural, count)
        return Markup(escape(text)).format(count=t.number(count), **values)

    return {"gettext": gettext, "ngettext": ngettext, "lang": t.language, "dir": t.direction}


def strong(value: object) -> Markup:
    return Markup("<strong>{}</strong>").format(value)


def render(
    request: Request, name: str, context: dict, status_code: int = 200, t: i18n.Translator | None = None
) -> Response:
    t = t or translator_for(request)
    response = templates.TemplateResponse(
        request, f"pages/{name}", {"css_url": CSS_URL, "strong": strong, **words(t), **context}, status_code=status_code
    )
    response.headers.update(SECURITY_HEADERS)
    response.headers["Content-Language"] = t.language
    return response


def form_page(request: Request, name: str, context: dict, subscriber: dict, status_code: int = 200) -> Response:
    """A page with forms, in the subscriber's language: the CSRF token in the context, its signed
    nonce cookie on the response."""
    csrf_token, new_nonce = csrf.issue(request, subscriber["id"])
    t = translator_for(request, subscriber)
    response = render(request, name, {**context, "csrf_token": csrf_token}, status_code=status_code, t=t)
    csrf.set_cookie(response, new_nonce)
    return response


def back_to(page_url: str, notice: str) -> Response:
    """303 to the page after a successful POST (POST/redirect/GET), with a notice to show."""
    response = RedirectResponse(f"{page_url}?notice={notice}", status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


def error_page(
    request: Request,
    status_code: int,
    title: str,
    message: str,
    back_url: str | None = None,
    subscriber: dict | None = None,
    values: dict | None = None,
) -> Response:
    """`title` and `message` are messages (marked with N_ where they are written), translated here
    in the subscriber's language (else Accept-Language's), `message` filled from `values`."""
    t = translator_for(request, subscriber)
    shown = {"title": t.gettext(title), "message": t.gettext(message, **(values or {})), "back_url": back_url}
    return render(request, "error.html", shown, status_code=status_code, t=t)


def not_found(request: Request) -> Response:
    return error_page(
        request,
        404,
        i18n.N_("Link not found"),
        i18n.N_("This link is invalid or no longer works. Use the link in your most recent email."),
    )


async def subscriber_for(purpose: str, token: str) -> tuple[dict, tokens.TokenClaims] | None:
    """The subscriber a link token names, or None (bad MAC, wrong purpose, unknown id, revoked)."""
    claims = tokens.verify(purpose, token)
    if claims is None:
        return None
    subscriber = await run_in_threadpool(records.load_by_id, claims.subscriber_id)
    if subscriber is None or subscriber["token_version"] != claims.token_version:
        log.info("rejected %s token for subscriber %s (revoked or erased)", purpose, claims.subscriber_id)
        return None
    return subscriber, claims


def token_page(purpose: str):
    """Endpoint decorator: the endpoint is called as (request, token, subscriber, claims); a bad,
    revoked or unknown token gets the 404 page."""

    def decorate(endpoint):
        @functools.wraps(endpoint)
        async def handler(request: Request) -> Response:
            token = request.path_params["token"]
            found = await subscriber_for(purpose, token)
            if found is None:
                return not_found(request)
            return await endpoint(request, token, *found)

        return handler

    return decorate


class FormTooLarge(Exception):
    pass


class BadForm(Exception):
    pass


async def read_form(request: Request) -> FormData:
    """The POSTed form (urlencoded or multipart), at most MAX_FORM_BYTES. A body with no or another
    content type is read as urlencoded: a one-click unsubscribe must not fail on a sloppy client."""
    try:
        declared = http.declared_length(request.headers)
    except http.BadContentLength as exc:
        raise BadForm(str(exc)) from None
    if declared is not None and declared > MAX_FORM_BYTES:
        raise FormTooLarge()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise FormTooLarge()
        chunks.append(chunk)
    body = b"".join(chunks)

    content_type = request.headers.get("content-type", "")
    headers = dict(request.scope["headers"])
    if not content_type.lower().startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        headers[b"content-type"] = b"application/x-www-form-urlencoded"
    scope = {**request.scope, "headers": list(headers.items())}
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(scope, replay).form(max_files=10, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FORM_BYTES)
    except HTTPException as exc:  # starlette turns multipart errors into 400s
        raise BadForm(str(exc.detail)) from None
    for _key, value in form.multi_items():
        if isinstance(value, UploadFile):
            await value.close()  # no field here is a file; drop them
    return form


def text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def texts(form: FormData, name: str) -> list[str]:
    return [v for v in form.getlist(name) if isinstance(v, str)]
