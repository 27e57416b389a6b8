"""Run one test module in a pytest process of its own beside an xdist run, as one more worker.

    python -m scripts.dev.beside --worker gw4 tests/web/test_api_fuzz.py -- PYTEST COMMAND...

Why: every xdist worker collects the whole suite, and the API fuzz module builds schemathesis's
coverage cases while it is collected (about 14 s of CPU per process): four workers paid for it
four times. Here the module is collected once, in a process that tests/conftest.py treats as
worker `--worker` (its own database and Redis db, derived as for gw0, gw1, ...; the same `alone`
locks), while the command runs with `--ignore=MODULE` appended. The command's output streams; the
module's follows it. The exit status is the command's, or the module's run's if that failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", required=True, help="the worker id the module's process takes (gwN)")
    parser.add_argument("module", help="the test module to run beside the command")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    locks = tempfile.mkdtemp(prefix="notify-test-locks-")
    env = {**os.environ, "NOTIFY_TEST_LOCK_DIR": locks}
    with tempfile.TemporaryFile(mode="w+") as out:
        side = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", args.module],
            env={**env, "PYTEST_XDIST_WORKER": args.worker},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            status = subprocess.call([*command, f"--ignore={args.module}"], env=env)
            side_status = side.wait()
        except KeyboardInterrupt:
            side.terminate()
            side.wait()
            return 130
        finally:
            shutil.rmtree(locks, ignore_errors=True)
        out.seek(0)
        print(f"\n{args.module} (beside, as {args.worker}):", flush=True)
        sys.stdout.write(out.read())
    if side_status != 0:
        print(f"{args.module}: failed (exit {side_status})", file=sys.stderr)
    return status or side_status


if __name__ == "__main__":
    sys.exit(main())
