"""app/platform/memory.py: the malloc arena cap is applied in a real process (glibc's mallopt)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from app.platform import memory

pytestmark = pytest.mark.pure


def test_zero_leaves_glibc_alone():
    assert memory.limit_malloc_arenas(0) is False


def test_the_cap_is_accepted_in_a_fresh_process():
    # A child process, so this test run's own allocator keeps its settings.
    code = "from app.platform import memory; import sys; sys.exit(0 if memory.limit_malloc_arenas(2) else 3)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


GIVE_BACK = """
import sys
from app.platform import memory

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

# A batch's buffers (over 512 bytes: glibc's, not Python's small-object allocator), one in 50 kept:
# the kept ones pin the arena, so glibc cannot shrink it from the top.
chunks = [bytes(2000) for _ in range(100_000)]
kept = chunks[::50]
del chunks
before = rss_mb()
given = memory.give_back_free_memory()
print(given, round(before), round(rss_mb()))
"""


def test_freed_memory_leaves_the_process_when_given_back():
    result = subprocess.run([sys.executable, "-c", GIVE_BACK], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    given, before, after = result.stdout.split()
    if given == "False":
        pytest.skip("not glibc: nothing to give back this way")
    assert int(before) - int(after) >= 100, result.stdout  # ~190 MB freed, pinned by 2,000 live chunks


class Recorder:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return True


def due(middleware) -> None:
    """The interval (an hour in these tests) has passed: whether memory goes back is up to the
    messages in flight alone, never to how fast this test runs."""
    middleware.last = time.monotonic() - 7200


def test_memory_goes_back_only_when_no_message_is_in_flight(settings):
    from actors.broker import GiveMemoryBack

    settings(memory_give_back_seconds=3600)
    give_back = Recorder()
    middleware = GiveMemoryBack(give_back)
    due(middleware)
    started = threading.Event()
    release = threading.Event()

    def other_thread():
        middleware.before_process_message(None, None)
        started.set()
        release.wait(10)
        middleware.after_process_message(None, None)

    thread = threading.Thread(target=other_thread)
    thread.start()
    started.wait(10)
    middleware.before_process_message(None, None)
    middleware.after_process_message(None, None)
    assert give_back.calls == 0  # the other thread still has its message
    release.set()
    thread.join(10)
    assert give_back.calls == 1  # the last one out gives back
    middleware.after_skip_message(None, None)  # a skip without a before: nothing unbalanced
    assert give_back.calls == 1  # and not again within the interval
    due(middleware)
    middleware.before_process_message(None, None)
    middleware.after_process_message(None, None)
    assert give_back.calls == 2


def test_memory_give_back_can_be_turned_off(settings):
    from actors.broker import GiveMemoryBack

    settings(memory_give_back_seconds=0)
    give_back = Recorder()
    middleware = GiveMemoryBack(give_back)
    due(middleware)
    middleware.before_process_message(None, None)
    middleware.after_process_message(None, None)
    assert give_back.calls == 0
