"""Operator sessions of the dashboard, server-side: the one owner of `admin_sessions`. Only a
session token's sha256 is stored, with the API key it belongs to and its expiry; the cookie that
carries the token, and signing in and out, are app/web/admin/session.py's."""

from __future__ import annotations

from typing import Any

from app.platform import db

SWEEP_AFTER = "7 days"  # how long an expired session row is kept (it says who was signed in from where)

_LOOKUP_SQL = """
SELECT s.id, k.id, k.name FROM admin_sessions s JOIN api_keys k ON k.id = s.api_key_id
WHERE s.token_hash = %s AND s.ended_at IS NULL AND s.expires_at > now()
  AND k.revoked_at IS NULL AND k.scope = 'admin'
"""


def create(token_hash: bytes, key_id: int, lifetime_seconds: int, ip: str | None, user_agent: str) -> None:
    """A new session for this admin key; sessions expired long ago are swept in the same transaction."""
    with db.raw_cursor() as cur:
        cur.execute(f"DELETE FROM admin_sessions WHERE expires_at < now() - interval '{SWEEP_AFTER}'")
        cur.execute(
            "INSERT INTO admin_sessions (token_hash, api_key_id, expires_at, ip, user_agent) "
            "VALUES (%s, %s, now() + make_interval(secs => %s), %s, %s)",
            (token_hash, key_id, lifetime_seconds, ip, user_agent),
        )


def lookup(token_hash: bytes) -> tuple[Any, ...] | None:
    """(session id, key id, key name) of a live session whose key is still an unrevoked admin key."""
    rows = db.query(_LOOKUP_SQL, (token_hash,))
    return rows[0] if rows else None


def end(session_id: int) -> None:
    db.query("UPDATE admin_sessions SET ended_at = now() WHERE id = %s AND ended_at IS NULL", (session_id,))
