"""CSRF protection for the subscriber pages: a signed double-submit token.

The browser gets a random nonce in a cookie (HttpOnly, SameSite=Strict) and the form carries
HMAC(secret, subscriber id + nonce). A cross-site page can neither read the cookie nor compute the
MAC, and SameSite=Strict keeps the cookie off cross-site POSTs altogether. Binding the subscriber id
means a token minted on one subscriber's page is useless on another's. Verification accepts every
key in SECRET_KEY_FALLBACKS so a key rotation does not break forms already open in a tab.

The RFC 8058 one-click POST never goes through here: mail clients send it without cookies.

`purpose` keeps forms of different areas apart: the operator dashboard (app/admin) signs with its own
purposes, so no token minted on a subscriber page is ever valid there, and the other way round.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from starlette.requests import Request
from starlette.responses import Response

from app.platform import config

COOKIE = "notify_csrf"
FIELD = "csrf_token"
_NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{22,64}$")


def _sign(secret: str, subscriber_id: int, nonce: str, purpose: str = "csrf") -> str:
    mac = hmac.new(secret.encode(), f"{purpose}\x00{int(subscriber_id)}\x00{nonce}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def token(subscriber_id: int, nonce: str, purpose: str = "csrf") -> str:
    """The form token for this binding and nonce (signed with SECRET_KEY)."""
    return _sign(config.get().secret_key, subscriber_id, nonce, purpose)


def matches(subscriber_id: int, nonce: str | None, submitted, purpose: str = "csrf") -> bool:
    """Constant-time check of a submitted token against every current and fallback key."""
    if nonce is None or not isinstance(submitted, str) or not submitted or len(submitted) > 100:
        return False
    return any(
        hmac.compare_digest(_sign(key, subscriber_id, nonce, purpose), submitted) for key in config.get().secret_keys
    )


def cookie_nonce(request: Request) -> str | None:
    nonce = request.cookies.get(COOKIE)
    return nonce if nonce and _NONCE_RE.fullmatch(nonce) else None


def issue(request: Request, subscriber_id: int, purpose: str = "csrf") -> tuple[str, str | None]:
    """(form token, new nonce to set as cookie or None when the browser already has one).
    Reusing an existing nonce keeps pages open in several tabs valid."""
    nonce = cookie_nonce(request)
    fresh = None
    if nonce is None:
        nonce = fresh = secrets.token_urlsafe(24)
    return token(subscriber_id, nonce, purpose), fresh


def set_cookie(response: Response, nonce: str | None) -> None:
    if nonce is None:
        return
    response.set_cookie(
        COOKIE,
        nonce,
        httponly=True,
        samesite="strict",
        path="/",
        secure=config.get().base_url.startswith("https://"),
    )


def valid(request: Request, subscriber_id: int, submitted, purpose: str = "csrf") -> bool:
    return matches(subscriber_id, cookie_nonce(request), submitted, purpose)
