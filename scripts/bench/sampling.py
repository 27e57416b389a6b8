"""Where running worker processes spend their CPU: py-spy samples each one (only the thread holding
the GIL, so a sample is Python running, not a thread waiting on a socket) and the samples of all of
them are summed by function.

scripts/bench/digest.py --sample SECONDS uses it on the real `dramatiq actors` processes of the run,
mid-wave: the profile of the path as it runs (eight threads, the SMTP lane, the collector), where
profile_digest.py's is one thread in a loop. py-spy needs ptrace (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

_LINE_NUMBER = re.compile(r":\d+\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed (make install: it is a dev dependency)")
    return found


class Sampler:
    """Samples `pids` for `seconds`, `delay` seconds after start(); report() once it has run."""

    def __init__(self, pids: list[int], seconds: float, delay: float, rate: int = 200):
        self.pids, self.seconds, self.delay, self.rate = pids, seconds, delay, rate
        self.dir = Path(tempfile.mkdtemp(prefix="digest-sample-"))
        self.thread = threading.Thread(target=self._run, name="py-spy", daemon=True)

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        time.sleep(self.delay)
        procs = [
            subprocess.Popen(
                [
                    py_spy(),
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(int(self.seconds)),
                    "--rate",
                    str(self.rate),
                    "--gil",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(self.dir / f"{pid}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for pid in self.pids
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=self.seconds + 30)
            if proc.returncode:
                print(f"  py-spy exited {proc.returncode}: {err.strip()[-300:]}")

    def report(self, top: int = 30) -> str:
        self.thread.join(self.delay + self.seconds + 60)
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0
        for path in self.dir.glob("*.txt"):
            for line in path.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                n = int(count)
                total += n
                frames = [_LINE_NUMBER.sub(")", f) for f in stack.split(";")]
                own[frames[-1]] += n
                for frame in set(frames):
                    inclusive[frame] += n
        shutil.rmtree(self.dir, ignore_errors=True)
        if not total:
            return "  no samples (py-spy could not attach, or the wave ended before the sampling began)"
        lines = [f"  {total} samples of the GIL holder in {len(self.pids)} worker processes; inclusive (top {top}):"]
        lines += [f"    {n / total:6.1%}  {frame[:110]}" for frame, n in inclusive.most_common(top)]
        lines.append(f"  own time (top {top}):")
        lines += [f"    {n / total:6.1%}  {frame[:110]}" for frame, n in own.most_common(top)]
        return "\n".join(lines)
