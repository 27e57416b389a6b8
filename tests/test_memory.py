"""app/platform/memory.py: the malloc arena cap is applied in a real process (glibc's mallopt)."""

from __future__ import annotations

import subprocess
import sys

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
