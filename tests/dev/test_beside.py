"""scripts/dev/beside.py: a module run in a process of its own beside a command, as one more worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
SIDE = """
import os

def test_runs_as_the_worker_it_was_given_with_the_shared_locks():
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw7"
    assert os.path.isdir(os.environ["NOTIFY_TEST_LOCK_DIR"])

def test_{name}():
    assert {ok}
"""
COMMAND = (
    "import os, sys; assert sys.argv[1] == '--ignore={module}'; "
    "assert 'PYTEST_XDIST_WORKER' not in os.environ; sys.exit({status})"
)


def beside(tmp_path, side_ok: bool, status: int) -> subprocess.CompletedProcess:
    module = tmp_path / "test_side.py"
    module.write_text(SIDE.format(name="side_passes" if side_ok else "side_fails", ok=side_ok))
    command = [sys.executable, "-c", COMMAND.format(module=module, status=status)]
    # as `make test` starts it: from outside any xdist worker and its locks
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "NOTIFY_TEST_LOCK_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "scripts.dev.beside", "--worker", "gw7", str(module), "--", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_both_pass_and_the_module_s_output_follows_the_command_s(tmp_path):
    done = beside(tmp_path, side_ok=True, status=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(beside, as gw7):" in done.stdout and "2 passed" in done.stdout


@pytest.mark.parametrize(("side_ok", "status", "expected"), [(False, 0, 1), (True, 3, 3), (False, 3, 3)])
def test_a_failure_on_either_side_fails_the_whole(tmp_path, side_ok, status, expected):
    done = beside(tmp_path, side_ok=side_ok, status=status)
    assert done.returncode == expected, done.stdout + done.stderr
    assert ("1 failed" in done.stdout) == (not side_ok)
