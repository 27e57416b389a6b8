"""Operator sign-in: an admin API key in, a server-side session out, held by a signed cookie.

The browser gets `notify_admin` = a random token signed with SECRET_KEY (itsdangerous, timestamped:
a cookie older than ADMIN_SESSION_HOURS is refused before any lookup; fallback keys still verify
after a rotation). Only the token's sha256 is stored, in `admin_sessions`
(app/platform/admin_sessions.py), with the API key id and the expiry. Every request looks the
session up together with its key, so signing out, an expired session or a revoked (or no longer
admin) key ends access at once — a copied cookie is worth nothing after sign-out. The API key itself
is never stored in the cookie or the session.

Cookie attributes: HttpOnly (no script reads it), SameSite=Strict (never sent on a cross-site
request: a first line against CSRF, the form tokens are the second), Path=/admin, Max-Age = the
session's life, and Secure — always, except when APP_ENV is development or test AND the request
itself came over plain http (`make run` on http://127.0.0.1:8000, the test client). In production
a browser on http:// therefore never gets a usable cookie: serve /admin over https (behind a proxy,
list it in FORWARDED_ALLOW_IPS so uvicorn sees the original scheme).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import itsdangerous
from starlette.requests import Request
from starlette.responses import Response

from app.platform import admin_sessions, config

COOKIE = "notify_admin"
COOKIE_PATH = "/admin"
_SALT = "notify.admin.session"
MAX_COOKIE_CHARS = 300
MAX_USER_AGENT_CHARS = 400


@dataclass(frozen=True)
class AdminSession:
    id: int
    key_id: int
    key_name: str
    token: str  # the random session token (the CSRF tokens of its forms are bound to it)


def _signer() -> itsdangerous.TimestampSigner:
    # itsdangerous signs with the last key and verifies with all: newest last.
    return itsdangerous.TimestampSigner(list(reversed(config.get().secret_keys)), salt=_SALT)


def lifetime_seconds() -> int:
    return max(60, int(config.get().admin_session_hours * 3600))


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def cookie_secure(request: Request) -> bool:
    return not (config.get().is_development and request.url.scheme == "http")


def _printable(text: str | None) -> str:
    """A client-sent header fit for a text column: printable characters only, bounded."""
    return "".join(ch for ch in (text or "")[:MAX_USER_AGENT_CHARS] if ch.isprintable())


def start(key_id: int, ip: str | None, user_agent: str | None) -> str:
    """A new session for this admin key; the signed cookie value. Long-expired sessions are swept."""
    token = secrets.token_urlsafe(32)
    admin_sessions.create(_hash(token), key_id, lifetime_seconds(), ip, _printable(user_agent))
    return _signer().sign(token).decode()


def token_from_cookie(request: Request) -> str | None:
    """The session token of a well-signed, unexpired cookie; None otherwise (no database access)."""
    raw = request.cookies.get(COOKIE)
    if not raw or len(raw) > MAX_COOKIE_CHARS:
        return None
    try:
        return _signer().unsign(raw, max_age=lifetime_seconds()).decode()
    except (itsdangerous.BadSignature, UnicodeDecodeError):
        return None


def lookup(token: str) -> AdminSession | None:
    row = admin_sessions.lookup(_hash(token))
    return AdminSession(*row, token) if row else None  # type: ignore[call-arg]  # every field but token


def end(session_id: int) -> None:
    admin_sessions.end(session_id)


def set_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=lifetime_seconds(),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request),
    )


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict", secure=cookie_secure(request))
