"""Set once this process has been asked to stop (a worker's SIGTERM): long loops finish the batch
in hand, claim nothing new, and hand the rest back to the queue."""

from __future__ import annotations

import threading

requested = threading.Event()
