"""Rendering for the operator pages: the subscriber pages' Jinja2 environment and security headers,
admin/ templates, the admin stylesheet, and the figures as text (chart descriptions, number formats)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from app.platform.providers import failover
from app.web.admin import stats
from app.web.admin.session import AdminSession
from app.web.pages import common, csrf

CSRF_PURPOSE = "admin"  # forms of a signed-in session, bound to the session's token
LOGIN_CSRF_PURPOSE = "admin-login"  # the sign-in form, bound to the csrf cookie's nonce
NAV = (
    ("dashboard", "/admin", "Dashboard"),
    ("newsletters", "/admin/newsletters", "Newsletters"),
    ("suppressions", "/admin/suppressions", "Suppressions"),
)


def _css_url() -> str:
    try:
        digest = hashlib.sha256((common.STATIC_DIR / "admin.css").read_bytes()).hexdigest()[:10]
    except OSError:
        digest = "0"
    return f"/static/admin.css?v={digest}"


CSS_URL = _css_url()


def page(
    request: Request,
    name: str,
    context: dict,
    current: AdminSession | None = None,
    status_code: int = 200,
    headers: dict | None = None,
) -> Response:
    full = {
        "css_url": CSS_URL,
        "nav": NAV,
        "current": current,
        "section": None,
        "notice": None,
        "csrf_token": csrf.token(current.id, current.token, CSRF_PURPOSE) if current else None,
        "mail_stop": getattr(request.state, "mail_stop", None) if current else None,
        **context,
    }
    response = common.templates.TemplateResponse(request, f"admin/{name}", full, status_code=status_code)
    response.headers.update(common.SECURITY_HEADERS)
    if headers:
        response.headers.update(headers)
    return response


def error(
    request: Request,
    status_code: int,
    title: str,
    message: str,
    current: AdminSession | None = None,
    headers: dict | None = None,
) -> Response:
    return page(request, "error.html", {"title": title, "message": message}, current, status_code, headers)


def redirect(url: str) -> Response:
    response = RedirectResponse(url, status_code=303)
    response.headers.update(common.SECURITY_HEADERS)
    return response


def csrf_ok(current: AdminSession, submitted) -> bool:
    return csrf.matches(current.id, current.token, submitted, CSRF_PURPOSE)


# -- figures as text -------------------------------------------------------------------------------


def number(value) -> str:
    return "—" if value is None else f"{value:,}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def when(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def when_seconds(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def hour_label(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%a %d %b %H:00")


def describe(name: str, d: stats.Dashboard) -> str:
    """The chart's alt text: what it shows and the figures that matter, in one sentence or two."""
    label = stats.RANGE_LABELS[d.window.name]
    if name in d.unavailable:
        return f"{label}: figures unavailable (the query did not finish in time)."
    if name == "sent":
        per_hour = d.sent_per_hour() or [0]
        busiest = max(range(len(per_hour)), key=per_hour.__getitem__)
        text = (
            f"Mails sent per hour, {label}: {number(sum(d.sent['digest']))} digests and "
            f"{number(sum(d.sent['newsletter']))} newsletter mails."
        )
        if per_hour[busiest]:
            text += f" Busiest hour {hour_label(d.window.hours[busiest])} UTC with {number(per_hour[busiest])}."
        return text
    if name == "rates":
        return (
            f"Open and click rates, {label}: {percent(d.rate('open'))} of the mails sent were opened and "
            f"{percent(d.rate('click'))} clicked (human traffic only)."
        )
    if name == "bounces":
        return (
            f"Bounces and complaints per hour, {label}: {number(sum(d.bounces or ()))} bounces, "
            f"{number(sum(d.complaints or ()))} complaints."
        )
    if name == "held":
        return (
            f"Mails held by quiet hours and released per hour, {label}: {number(sum(d.held or ()))} held, "
            f"{number(sum(d.released or ()))} released at the end of their window."
        )
    p50, p95 = d.lateness_total or (None, None)
    return f"Digest lateness per hour, {label}: p50 {duration(p50)}, p95 {duration(p95)} over the window."


@dataclass(frozen=True)
class BreakerRow:
    """A provider's circuit breaker as the dashboard shows it (failover.status, one row each)."""

    name: str
    state: str
    since: datetime | None
    for_seconds: float | None
    failures: int
    last_failure: datetime | None
    reported: bool


def breakers(shown: list[failover.ProviderStatus], now: float | None = None) -> list[BreakerRow]:
    now = time.time() if now is None else now
    return [
        BreakerRow(
            p.name,
            p.breaker or "closed",
            _utc(p.since),
            max(0.0, now - p.since) if p.since else None,
            p.failures,
            _utc(p.last_failure),
            p.reported,
        )
        for p in shown
    ]


def _utc(unix: float | None) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix else None
