"""Process memory tuning done at start-up, before the worker or request threads exist.

glibc gives each thread that contends for the allocator its own arena, up to 8 per core; freed
memory stays in the arena that allocated it. A worker's threads allocate large, short-lived
buffers (rendered batches, provider request bodies) in whichever arena they hold, so RSS grows
with the thread count rather than with the work. Capping the arenas (mallopt M_ARENA_MAX, the same
as the MALLOC_ARENA_MAX environment variable, but without relying on how a process is started)
keeps the peak down at no measured cost in speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("app.platform.memory")

M_ARENA_MAX = -8  # glibc's <malloc.h>


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for this process (0: leave glibc's default). False when the C
    library is not glibc or refused."""
    if arenas <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        log.debug("mallopt is not available; malloc arenas left as they are")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(M_ARENA_MAX, arenas) == 1)
    if not done:
        log.warning("mallopt(M_ARENA_MAX, %d) was refused", arenas)
    return done
