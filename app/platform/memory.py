"""Process memory tuning: the arena cap at start-up, before the worker or request threads exist,
and giving freed pages back while a worker runs (actors/broker.py GiveMemoryBack).

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
import functools
import logging

log = logging.getLogger("app.platform.memory")

M_ARENA_MAX = -8  # glibc's <malloc.h>


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def give_back_free_memory() -> bool:
    """Return the free pages inside glibc's arenas to the kernel (malloc_trim(0)): what a batch freed
    stays in the process otherwise, since glibc only shrinks an arena from its top and a few live
    chunks above the freed ones pin it. False when the C library is not glibc."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    trim(0)
    return True


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for this process (0: leave glibc's default). False when the C
    library is not glibc or refused."""
    if arenas <= 0:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS): nothing to tune
        log.debug("mallopt is not available; malloc arenas left as they are")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(M_ARENA_MAX, arenas) == 1)
    if not done:
        log.warning("mallopt(M_ARENA_MAX, %d) was refused", arenas)
    return done
