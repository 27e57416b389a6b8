"""This host's CPU as every process sees it: the idle share of all its cores (/proc/stat).

Both send loops that grow read it: newsletter send chains (app/newsletter/growth.py) add a chain only
while the host has idle CPU, and the SMTP pool (providers/smtp_sizing.py) tries more connections to a
relay next door only then. A busy host makes any throughput measured in the meantime noise: another
process's pause looks like a gain.
"""

from __future__ import annotations

import threading
import time

SAMPLE_INTERVAL_SECONDS = 1.0


class HostIdle:
    """The host's idle CPU share since the previous sample (/proc/stat), re-sampled at most once per
    `interval`; 1.0 where /proc/stat does not exist."""

    def __init__(self, path: str = "/proc/stat", interval: float = SAMPLE_INTERVAL_SECONDS) -> None:
        self.path, self.interval = path, interval
        self._lock = threading.Lock()
        first = self._read()
        # (monotonic time, idle jiffies, total jiffies) of the previous sample
        self._last: tuple[float, int, int] | None = (time.monotonic(), *first) if first else None
        self._share = 1.0

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal ...: idle + iowait is time nobody wanted the CPU
        return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])

    def share(self) -> float:
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last[0] < self.interval:
                return self._share
            sample = self._read()
            if sample is None:
                return 1.0
            if self._last is not None:
                idle, total = sample[0] - self._last[1], sample[1] - self._last[2]
                if total > 0:
                    self._share = max(0.0, min(1.0, idle / total))
            self._last = (now, *sample)
            return self._share


host_idle = HostIdle()
