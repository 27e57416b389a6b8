"""Signed subscriber link tokens for unsubscribe and preference pages.

token = base64url(payload) "." base64url(HMAC-SHA256(secret, purpose + payload))
payload = "v1:<subscriber_id>:<token_version>[:<scope>]"

Never expire, but revocable: bumping subscribers.token_version invalidates every token issued so
far. Verification accepts SECRET_KEY and every SECRET_KEY_FALLBACKS entry (key rotation). Ids are
inside the MAC, so tokens cannot be forged or enumerated.

Hand-written rather than itsdangerous because tokens already in inboxes must keep verifying
(golden fixtures: tests/platform/test_tokens_golden.py) and because it is cheaper per mail (two tokens per
mail) and shorter: `scripts/bench/tokens.py` measures both against itsdangerous URLSafeSerializer
(BENCHMARKS.md, "subscriber link tokens").
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass

from app.platform import config
from app.platform.validation import plain_int

# "view": a sent digest's hosted copy (GET /v/{token}, scope "run:<id>"); like the others it never
# expires and dies with the token_version, so it lives exactly as long as the unsubscribe link.
# "feed": a front end's short-lived key to one subscriber's in-app feed (scope "exp:<unix time>");
# unlike the others it expires, and also dies with the token_version.
PURPOSES = ("unsubscribe", "preferences", "view", "feed")


@dataclass(frozen=True)
class TokenClaims:
    subscriber_id: int
    token_version: int
    scope: str | None  # e.g. "newsletter:42" or "category:likes"; None = everything


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# HMAC-SHA256 keyed and fed its prefix once per (key, prefix); each MAC copies it and adds its
# payload: the same as hmac.digest(key, prefix + payload, "sha256"), without the key schedule every
# time (~1 us a signature). Link tokens here and tracking codes (tracking/codes.py) sign through it.
_keyed: dict[tuple[str, bytes], hmac.HMAC] = {}


def hmac_sha256(key: str, prefix: bytes, payload: bytes) -> bytes:
    base = _keyed.get((key, prefix))
    if base is None:
        if len(_keyed) > 16:  # keys change only on rotation; never grow without bound
            _keyed.clear()
        base = _keyed[(key, prefix)] = hmac.new(key.encode(), prefix, "sha256")
    mac = base.copy()
    mac.update(payload)
    return mac.digest()


def _mac(secret: str, purpose: str, payload: bytes) -> bytes:
    return hmac_sha256(secret, purpose.encode() + b"\x00", payload)[:16]


def make(purpose: str, subscriber_id: int, token_version: int = 1, scope: str | None = None) -> str:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown token purpose {purpose!r}")
    payload = f"v1:{int(subscriber_id)}:{int(token_version)}" + (f":{scope}" if scope else "")
    raw = payload.encode()
    return f"{_b64(raw)}.{_b64(_mac(config.get().secret_key, purpose, raw))}"


def verify(purpose: str, token: str) -> TokenClaims | None:
    """Claims if the MAC matches under any current or fallback key; None otherwise.
    The caller still checks token_version against the subscriber row (revocation)."""
    if purpose not in PURPOSES or not isinstance(token, str) or len(token) > 400 or token.count(".") != 1:
        return None
    body, mac = token.split(".")
    try:
        raw, given = _unb64(body), _unb64(mac)
    except (ValueError, TypeError):
        return None
    if not any(hmac.compare_digest(_mac(key, purpose, raw), given) for key in config.get().secret_keys):
        return None
    parts = raw.decode("utf-8", "replace").split(":", 3)
    if len(parts) < 3 or parts[0] != "v1" or not _is_id(parts[1]) or not _is_id(parts[2]):
        return None
    return TokenClaims(int(parts[1]), int(parts[2]), parts[3] if len(parts) == 4 else None)


def _is_id(text: str) -> bool:
    # 18 digits: every bigint id fits, and Postgres is never asked about an out-of-range one.
    return plain_int(text, 18) is not None


def unsubscribe_url(subscriber_id: int, token_version: int = 1, scope: str | None = None) -> str:
    return f"{config.get().base_url}/u/{make('unsubscribe', subscriber_id, token_version, scope)}"


def view_url(subscriber_id: int, token_version: int, run_id: int) -> str:
    return f"{config.get().base_url}/v/{make('view', subscriber_id, token_version, f'run:{int(run_id)}')}"


def run_id(claims: TokenClaims) -> int | None:
    """The digest run a view token names, or None."""
    scope = claims.scope or ""
    if scope.startswith("run:") and _is_id(scope[4:]):
        return int(scope[4:])
    return None


def preferences_path(subscriber_id: int, token_version: int = 1) -> str:
    return f"/preferences/{make('preferences', subscriber_id, token_version)}"


def preferences_url(subscriber_id: int, token_version: int = 1) -> str:
    return config.get().base_url + preferences_path(subscriber_id, token_version)


def feed_token(subscriber_id: int, token_version: int, expires_at: int) -> str:
    """A feed token for one subscriber, valid until `expires_at` (Unix seconds)."""
    return make("feed", subscriber_id, token_version, f"exp:{int(expires_at)}")


def verify_feed(token: str, now: float) -> TokenClaims | None:
    """The claims of an unexpired feed token, or None. The caller still checks token_version."""
    claims = verify("feed", token)
    scope = claims.scope or "" if claims else ""
    if claims is None or not scope.startswith("exp:") or not _is_id(scope[4:]):
        return None
    return claims if int(scope[4:]) > now else None
