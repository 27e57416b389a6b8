"""What the profilers (profile_digest.py, profile_newsletter.py) share: thread CPU time summed per
stage of a path, and a cProfile's own time summed per area of the tree."""

from __future__ import annotations

import threading
import time
from collections import defaultdict


class StageTimer:
    """`wrap(owner, attr, stage)` replaces a function with one that adds the calling thread's CPU
    time inside it to `totals[stage]`; a stage called inside another is subtracted from the outer."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._local = threading.local()

    def wrap(self, owner, attr: str, stage: str) -> None:
        real, totals, local = getattr(owner, attr), self.totals, self._local

        def timed(*a, **kw):
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            stack.append(0.0)
            started = time.thread_time()
            try:
                return real(*a, **kw)
            finally:
                spent = time.thread_time() - started
                inner = stack.pop()
                totals[stage] += spent - inner
                if stack:
                    stack[-1] += spent

        setattr(owner, attr, timed)


def by_area(stats, areas: list[tuple[str, tuple[str, ...]]]) -> tuple[dict[str, float], float]:
    """({area: own seconds}, total) of a pstats.Stats; a function's area is the first whose needles
    its file path or name contains ("other" if none)."""
    out: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():
        where = f"{filename} {name}"
        out[next((area for area, needles in areas if any(n in where for n in needles)), "other")] += tottime
        total += tottime
    return out, total
