"""API keys: shown once at creation, stored as sha256 only; verified with a short in-process cache."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass

from app.platform import config, db
from app.platform.negcache import NegativeCache

SCOPES = ("events", "admin")
KEY_PREFIX = "nk_"
# Every key create() ever issued has this shape; anything else is refused without a lookup.
_KEY_SHAPE = re.compile(r"nk_[A-Za-z0-9_-]{16,200}")
MAX_UNKNOWN_KEYS = 100_000


@dataclass(frozen=True)
class Principal:
    key_id: int
    name: str
    scope: str

    def allows(self, scope: str) -> bool:
        # admin keys may do everything an events key may
        return self.scope == scope or self.scope == "admin"


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def create(name: str, scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    if not name or len(name) > 100:
        raise ValueError("name must be 1-100 characters")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with db.raw_cursor() as cur:
        cur.execute(
            "INSERT INTO api_keys (name, scope, key_prefix, key_hash) VALUES (%s, %s, %s, %s)",
            (name, scope, key[:10], hash_key(key)),
        )
    return key


def revoke(name_or_prefix: str) -> int:
    with db.raw_cursor() as cur:
        cur.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE revoked_at IS NULL AND (name = %s OR key_prefix = %s)",
            (name_or_prefix, name_or_prefix),
        )
        return cur.rowcount


def list_keys() -> list[tuple]:
    with db.raw_cursor() as cur:
        cur.execute("SELECT id, name, scope, key_prefix, created_at, revoked_at FROM api_keys ORDER BY id")
        return cur.fetchall()


def well_formed(key: str) -> bool:
    return _KEY_SHAPE.fullmatch(key) is not None


class KeyCache:
    """Positive lookups are cached for API_KEY_CACHE_SECONDS: revocation is effective within that.
    Unknown keys are remembered as unknown for as long (bounded in number), so a flood of junk
    keys costs one query per distinct key, and a key created meanwhile (by the CLI, another
    process) works within that bound."""

    def __init__(self):
        self._entries: dict[bytes, tuple[float, Principal]] = {}
        self._key_locks: dict[bytes, threading.Lock] = {}
        self._lock = threading.Lock()
        self._unknown = NegativeCache(MAX_UNKNOWN_KEYS, lambda: config.get().api_key_cache_seconds)

    def known_unknown(self, key: str) -> bool:
        """True when the key is certainly not valid, decided without the database (async hot path)."""
        return not well_formed(key) or hash_key(key) in self._unknown

    def peek(self, key: str) -> Principal | None:
        """The cached principal without touching the database (the async hot path)."""
        hit = self._entries.get(hash_key(key))
        if hit and hit[0] > time.monotonic():
            return hit[1]
        return None

    def lookup(self, key: str) -> Principal | None:
        if not well_formed(key):
            return None
        digest = hash_key(key)
        ttl = config.get().api_key_cache_seconds
        with self._lock_for(digest):  # a cold cache under a burst asks the database once per key
            hit = self._entries.get(digest)
            if ttl > 0 and hit and hit[0] > time.monotonic():
                return hit[1]
            if digest in self._unknown:
                return None
            rows = db.query(
                "SELECT id, name, scope FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL", (digest,)
            )
            principal = Principal(*rows[0]) if rows else None
            if principal is None:
                self._unknown.add(digest)
            with self._lock:
                if principal is None or ttl <= 0:
                    self._entries.pop(digest, None)
                else:
                    if len(self._entries) > 10_000:
                        self._entries.clear()
                    self._entries[digest] = (time.monotonic() + ttl, principal)
            return principal

    def _lock_for(self, digest: bytes) -> threading.Lock:
        with self._lock:
            if len(self._key_locks) > 10_000:
                self._key_locks.clear()
            return self._key_locks.setdefault(digest, threading.Lock())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
        self._unknown.clear()


cache = KeyCache()
