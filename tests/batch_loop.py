"""A thread that repeats one batch of writes until stopped: the live traffic of tests that change
the schema under it (tests/platform/test_partition_migration.py, tests/platform/test_partitioned_index.py)."""

from __future__ import annotations

import threading
import time


class BatchLoop:
    """Subclasses write one batch in `one_batch(n)`; `batches` counts those done."""

    def __init__(self):
        self.batches = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def one_batch(self, n: int) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.one_batch(self.batches)
                self.batches += 1
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def start(self) -> None:
        self._thread.start()

    def wait_batches(self, more: int) -> None:
        """Bounded wait until `more` further batches are done (not a timing assertion)."""
        target = self.batches + more
        deadline = time.monotonic() + 120
        while self.batches < target and not self.errors:
            assert time.monotonic() < deadline, "the writes stalled"
            time.sleep(0.005)

    def stop(self) -> None:
        """Stop after the batch in progress; raise the error that ended the loop early, if any."""
        self._stop.set()
        self._thread.join(60)
        if self.errors:
            raise self.errors[0]
