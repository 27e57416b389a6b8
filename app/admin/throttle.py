"""Failed /admin sign-ins, counted per client address in a fixed 15-minute window.

Past ADMIN_LOGIN_MAX_FAILURES the sign-in form answers 429 until the window ends, without looking
at the key. The counter lives in Redis so every web process shares it (INCR, and EXPIRE when the window
starts); if Redis does not answer, this process counts on its own (bounded), so an outage
never turns the limit off. Admin keys are 256-bit random, so this is not what stops guessing:
it keeps a scripted attacker from hammering the sign-in (and the key lookups behind it).
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time

import redis as redis_lib

from app import config, queue

log = logging.getLogger("app.admin.throttle")

WINDOW_SECONDS = 900
_PREFIX = "notify:admin:login-failures:"
_MAX_LOCAL = 10_000
_local: dict[str, tuple[float, int]] = {}
_local_lock = threading.Lock()


def _key(client: str | None) -> str:
    # Hashed: the counter key stays short whatever a client claims to be.
    return _PREFIX + hashlib.sha256((client or "unknown").encode()).hexdigest()[:24]


def _client():
    return queue.broker().client


def _local_count(key: str, add: int) -> tuple[int, int]:
    now = time.monotonic()
    with _local_lock:
        started, count = _local.get(key, (now, 0))
        if now - started >= WINDOW_SECONDS:
            started, count = now, 0
        count += add
        if add:
            if len(_local) >= _MAX_LOCAL:
                _local.clear()
            _local[key] = (started, count)
        return count, int(WINDOW_SECONDS - (now - started))


def blocked_for(client: str | None) -> int:
    """Seconds until this client may try again; 0 when it may try now."""
    key = _key(client)
    try:
        pipe = _client().pipeline()
        pipe.get(key)
        pipe.ttl(key)
        raw, ttl = pipe.execute()
        count, remaining = int(raw or 0), max(int(ttl), 1)
    except redis_lib.RedisError as exc:
        log.warning("login throttle: Redis unavailable (%s); counting in this process", exc)
        count, remaining = _local_count(key, 0)
    return remaining if count >= config.get().admin_login_max_failures else 0


def failed(client: str | None) -> None:
    key = _key(client)
    try:
        client = _client()
        pipe = client.pipeline()
        pipe.incr(key)
        pipe.ttl(key)
        _count, ttl = pipe.execute()
        if ttl < 0:   # the window starts with its first failure (EXPIRE NX would need Redis 7)
            client.expire(key, WINDOW_SECONDS)
    except redis_lib.RedisError as exc:
        log.warning("login throttle: Redis unavailable (%s); counting in this process", exc)
        _local_count(key, 1)


def succeeded(client: str | None) -> None:
    try:
        _client().delete(_key(client))
    except redis_lib.RedisError:
        pass
    with _local_lock:
        _local.pop(_key(client), None)
