"""A bounded, expiring set of keys known NOT to exist (unknown API keys, unknown tracking codes).

Junk is the input an attacker controls, so what remembers it must be bounded in size (the oldest
entries go first, one at a time, so a flood of fresh junk never wipes out everything at once) and
in time (a key or code created after it was seen missing must start working within the TTL).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class NegativeCache:
    def __init__(self, max_size: int, ttl: float | Callable[[], float]):
        self.max_size = max_size
        # A callable is read on every add, so tests and settings reloads change it without a restart.
        self._ttl = ttl if callable(ttl) else (lambda: ttl)
        self._expiry: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        expiry = self._expiry.get(key)  # lock-free read: the hot path of every junk request
        if expiry is None:
            return False
        if expiry > time.monotonic():
            return True
        self.discard(key)
        return False

    def add(self, key: Hashable) -> None:
        ttl = self._ttl()
        if ttl <= 0 or self.max_size <= 0:
            return
        with self._lock:
            self._expiry.pop(key, None)  # re-adding moves it to the young end
            self._expiry[key] = time.monotonic() + ttl
            while len(self._expiry) > self.max_size:
                self._expiry.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._expiry.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._expiry.clear()

    def __len__(self) -> int:
        return len(self._expiry)
