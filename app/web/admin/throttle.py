"""/admin sign-in attempts, counted per client address in a fixed 15-minute window.

Each attempt is counted before its key is checked, in one atomic step (a Redis script: INCR, and
EXPIRE when the window starts), and only the first ADMIN_LOGIN_MAX_FAILURES of a window are
checked at all; the others answer 429 until the window ends, without looking at the key. Checking
first and counting the failure afterwards let parallel attempts all pass the check before any was
counted. A successful sign-in clears the count, so in effect failures are what is limited.
The counter lives in Redis so every web process shares it; if Redis does not answer, this process
counts on its own (bounded, under a lock), so an outage never turns the limit off. Admin keys are
256-bit random, so this is not what stops guessing: it keeps a scripted attacker from hammering
the sign-in (and the key lookups behind it).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import redis as redis_lib

from app.platform import config, queue

log = logging.getLogger("app.web.admin.throttle")

WINDOW_SECONDS = 900
_PREFIX = "notify:admin:login-attempts:"
_MAX_LOCAL = 10_000
_local: dict[str, tuple[float, int]] = {}
_local_lock = threading.Lock()

# One script, so counting and starting the window are one atomic step (EXPIRE NX needs Redis 7).
_COUNT_ATTEMPT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return {count, redis.call('TTL', KEYS[1])}
"""


def _key(client: str | None) -> str:
    # Hashed: the counter key stays short whatever a client claims to be.
    return _PREFIX + hashlib.sha256((client or "unknown").encode()).hexdigest()[:24]


def _client():
    return queue.broker().client


def _local_count(key: str) -> tuple[int, int]:
    now = time.monotonic()
    with _local_lock:
        started, count = _local.get(key, (now, 0))
        if now - started >= WINDOW_SECONDS:
            started, count = now, 0
        count += 1
        if len(_local) >= _MAX_LOCAL:
            _local.clear()
        _local[key] = (started, count)
        return count, int(WINDOW_SECONDS - (now - started))


def admit(client: str | None) -> int:
    """Count one sign-in attempt. 0 when its key may be checked; otherwise the seconds until this
    client may try again."""
    key = _key(client)
    try:
        count, ttl = _client().eval(_COUNT_ATTEMPT, 1, key, WINDOW_SECONDS)
        remaining = max(int(ttl), 1)
    except redis_lib.RedisError as exc:
        log.warning("login throttle: Redis unavailable (%s); counting in this process", exc)
        count, remaining = _local_count(key)
    return remaining if int(count) > config.get().admin_login_max_failures else 0


def succeeded(client: str | None) -> None:
    try:
        _client().delete(_key(client))
    except redis_lib.RedisError:
        pass
    with _local_lock:
        _local.pop(_key(client), None)
