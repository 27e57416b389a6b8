"""Adaptive send rate per provider, shared by every worker process through Redis.

A token bucket in one Redis hash, updated by Lua scripts (atomic; the clock is Redis's TIME, so
workers on different hosts agree). Units are recipients per second.

- PROVIDER_RATE_PER_SECOND is the ceiling (0 = no configured limit).
- A 429 halves the current rate (at most once a second, so a storm seen by eight workers at once
  is one downshift, not eight) and blocks everyone until the provider's reset time.
- Each successful batch raises the rate by 5% (+1) until it is back at the ceiling: gradual recovery.
- With no configured ceiling the limiter is a no-op until the first 429; it then starts from
  ADAPTIVE_START_RATE and recovers until it passes UNLIMITED_ABOVE, where the limit is lifted again.

Redis is only a hint here too: if it is flushed or down, sending continues unthrottled and the
provider's next 429 re-establishes the limit.

Kept over dramatiq.rate_limits: a batch takes its n recipients' tokens in one Lua call, where
BucketRateLimiter admits one unit per acquire() (`scripts/bench/ratelimit.py` compares the limiter
time per recipient; BENCHMARKS.md, "send-rate limiter"), and the adaptive part (429 halves the rate
for every worker, gradual recovery) has no counterpart there.
"""

from __future__ import annotations

import logging
import time

import redis as redis_lib

from app.newsletter import kick
from app.platform import config

log = logging.getLogger("app.newsletter.ratelimit")

ADAPTIVE_START_RATE = 1000.0
UNLIMITED_ABOVE = 100_000.0
MIN_RATE = 1.0
KEY_TTL_MS = 3_600_000

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ceiling, n, max_wait = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'rate', 'tokens', 'ts', 'blocked_until')
local rate = tonumber(h[1]) or ceiling
local blocked = tonumber(h[4]) or 0
local wait = 0
if blocked > now then wait = blocked - now end
if rate <= 0 then return wait end
local tokens, ts = tonumber(h[2]), tonumber(h[3])
if tokens == nil or ts == nil then tokens = rate; ts = now end
local cap = math.max(rate, n)
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate / 1000)
local after = tokens - n
local deficit_wait = 0
if after < 0 then deficit_wait = math.ceil(-after * 1000 / rate) end
if deficit_wait > wait then wait = deficit_wait end
if wait > max_wait then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
  return -wait
end
redis.call('HSET', KEYS[1], 'tokens', tostring(after), 'ts', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return wait
"""

_THROTTLED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ceiling, retry_ms, start, min_rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local h = redis.call('HMGET', KEYS[1], 'rate', 'last_down', 'blocked_until')
local rate = tonumber(h[1]) or ceiling
if rate <= 0 then rate = start * 2 end
local last_down = tonumber(h[2]) or 0
if now - last_down >= 1000 then
  rate = math.max(min_rate, rate / 2)
  redis.call('HSET', KEYS[1], 'rate', tostring(rate), 'last_down', now, 'tokens', '0', 'ts', now)
end
local blocked = math.max(tonumber(h[3]) or 0, now + retry_ms)
redis.call('HSET', KEYS[1], 'blocked_until', blocked)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return tostring(rate)
"""

_SUCCEEDED = """
local h = redis.call('HMGET', KEYS[1], 'rate')
local rate = tonumber(h[1])
if rate == nil then return '' end
local ceiling, unlimited_above = tonumber(ARGV[1]), tonumber(ARGV[2])
rate = rate * 1.05 + 1
if (ceiling > 0 and rate >= ceiling) or (ceiling <= 0 and rate >= unlimited_above) then
  redis.call('HDEL', KEYS[1], 'rate', 'last_down')
  return 'recovered'
end
redis.call('HSET', KEYS[1], 'rate', tostring(rate))
return tostring(rate)
"""


class AdaptiveRateLimiter:
    def __init__(self, provider_name: str, client=None, ceiling: float | None = None):
        self.key = f"notify:ratelimit:{provider_name}"
        self.client = client or kick.redis_client()
        self.ceiling = float(config.get().provider_rate_per_second if ceiling is None else ceiling)
        self._acquire = self.client.register_script(_ACQUIRE)
        self._throttled = self.client.register_script(_THROTTLED)
        self._succeeded = self.client.register_script(_SUCCEEDED)

    def reserve(self, n: int, max_wait: float = 2.0) -> tuple[bool, float]:
        """(granted, wait_seconds). Granted: the tokens are taken; sleep `wait` then send. Not
        granted: nothing was taken; come back in `wait` seconds (re-enqueue instead of sleeping)."""
        try:
            ms = int(self._acquire(keys=[self.key], args=[self.ceiling, n, int(max_wait * 1000), KEY_TTL_MS]))
        except redis_lib.RedisError as exc:
            log.warning("rate limiter unavailable (%s); sending without the shared limit", exc)
            return True, 0.0
        return (ms >= 0), abs(ms) / 1000.0

    def acquire(self, n: int, max_wait: float = 2.0) -> tuple[bool, float]:
        granted, wait = self.reserve(n, max_wait)
        if granted and wait > 0:
            time.sleep(wait)
        return granted, wait

    def throttled(self, retry_after: float | None) -> None:
        retry_ms = int(max(0.5, retry_after if retry_after is not None else 1.0) * 1000)
        try:
            rate = self._throttled(
                keys=[self.key], args=[self.ceiling, retry_ms, ADAPTIVE_START_RATE, MIN_RATE, KEY_TTL_MS]
            )
            log.warning("provider throttled us: rate now %s/s, everyone waits %.1fs", _text(rate), retry_ms / 1000)
        except redis_lib.RedisError as exc:
            log.warning("rate limiter unavailable (%s); backing off locally only", exc)

    def succeeded(self) -> None:
        try:
            result = _text(self._succeeded(keys=[self.key], args=[self.ceiling, UNLIMITED_ABOVE]))
        except redis_lib.RedisError:
            return
        if result == "recovered":
            log.info("send rate recovered to the configured ceiling")

    def current_rate(self) -> float | None:
        """The adaptive rate in force, or None when only the ceiling (or nothing) applies."""
        raw = self.client.hget(self.key, "rate")
        return float(raw) if raw is not None else None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_limiters: dict[tuple, AdaptiveRateLimiter] = {}


def for_provider(name: str) -> AdaptiveRateLimiter:
    settings = config.get()
    key = (name, settings.redis_url, settings.provider_rate_per_second)
    limiter = _limiters.get(key)
    if limiter is None:
        limiter = _limiters[key] = AdaptiveRateLimiter(name)
    return limiter
