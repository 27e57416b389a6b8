"""Worker set-up: Sentry first, then the broker (app/platform/queue.py, with the worker-only GracefulStop
middleware), then — in actors/__init__ — the actors, which bind to it. Queues: app/platform/queue.py."""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections.abc import Callable

from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from app.platform import config, db, memory, metrics, observability, queue, shutdown

log = logging.getLogger("actors.broker")


# The parent's forwarded copy of a SIGTERM arrives within moments of the group's own: one stop, not
# news. A SIGTERM later than this is someone asking again, and is answered in the log.
ECHO_SECONDS = 2.0


def stop_once(stop, clock=time.monotonic):
    """A SIGTERM handler that calls stop() on the first SIGTERM only. A later one is logged (the
    worker is still finishing in-flight work), unless it is the echo of the first (ECHO_SECONDS): one
    Ctrl-C under honcho reaches a worker process twice and said "SIGTERM again" every time."""
    first: list[float] = []

    def once(signum, frame):
        if first:
            if clock() - first[0] > ECHO_SECONDS:
                log.warning("SIGTERM again: still finishing in-flight work (SIGKILL to force)")
            return
        first.append(clock())
        stop(signum, frame)

    once.graceful = True  # type: ignore[attr-defined]  # marks our handler: installed once
    return once


class GracefulStop(Middleware):
    """A deploy sends SIGTERM to every process of the worker (Heroku, honcho and systemd signal the
    whole group) and Dramatiq's parent forwards its own: a worker process receives SIGTERM twice,
    and Dramatiq treats the second as "kill now" — cutting off batches at the provider, whose rows
    were then sent again. Here every SIGTERM after the first is only logged: the worker finishes its
    in-flight messages (bounded by --worker-shutdown-timeout, see the Procfile) and exits; SIGKILL
    still ends it at once."""

    def after_process_boot(self, broker):
        stop = signal.getsignal(signal.SIGTERM)
        if not callable(stop) or getattr(stop, "graceful", False):
            return
        signal.signal(signal.SIGTERM, stop_once(stop))

    def before_worker_shutdown(self, broker, worker):
        shutdown.requested.set()  # send loops stop claiming; their batches in hand still finish


class Metrics(Middleware):
    """Each worker process (Dramatiq forks them) clears the live gauges of processes that are gone
    when it starts, and its own when it stops (app/platform/metrics.py, multiprocess mode)."""

    def after_process_boot(self, broker):
        metrics.setup()

    def after_worker_shutdown(self, broker, worker):
        metrics.process_stopped()


class CollectorTuning(Middleware):
    """As in the web process: start-up objects leave the collector's view and young collections run
    less often. A digest batch allocates a lot of short-lived objects (groups, lines, MIME parts);
    the default thresholds collected ~40 us per digest (scripts/bench/profile_digest.py)."""

    def after_process_boot(self, broker):
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)


class GiveMemoryBack(Middleware):
    """What a batch frees goes back to glibc, not to the system: RSS kept every wave's high-water
    mark (docs/scaling.md: memory). When the last message in flight in this process ends, and the
    previous give-back is MEMORY_GIVE_BACK_SECONDS old, the free pages are returned; a busy process
    is using its memory, and an idle one gives it back within one message."""

    def __init__(self, give_back: Callable[[], bool] = memory.give_back_free_memory) -> None:
        self.give_back = give_back
        self.lock = threading.Lock()
        self.working: set[int] = set()  # thread idents with a message in hand (skips unbalance a counter)
        self.last = time.monotonic()

    def before_process_message(self, broker, message):
        with self.lock:
            self.working.add(threading.get_ident())

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self._finished()

    def after_skip_message(self, broker, message):
        self._finished()

    def _finished(self) -> None:
        every = config.get().memory_give_back_seconds
        with self.lock:
            self.working.discard(threading.get_ident())
            if every <= 0 or self.working or time.monotonic() - self.last < every:
                return
            self.last = time.monotonic()
        self.give_back()


class IdlePoll(Middleware):
    """An idle Dramatiq consumer backs off up to worker_timeout (1 s by default) between looks at
    its queue: the first digest batch of an hour and a send-now mail waited up to a second on
    workers that had nothing to do. Set before the worker adds its consumers; WORKER_IDLE_POLL_MS
    (app/platform/config.py says what the polling costs)."""

    def before_worker_boot(self, broker, worker):
        worker.worker_timeout = max(10, config.get().worker_idle_poll_ms)


def setup(url: str | None = None) -> RedisBroker:
    # First: each worker process imports the actors (and runs this) before any thread of its own.
    memory.limit_malloc_arenas(config.get().malloc_arenas)
    observability.setup_logging()
    observability.init_sentry("worker")
    db.init()
    return queue.install(
        queue.make_broker(
            url, extra_middleware=[GracefulStop(), Metrics(), CollectorTuning(), IdlePoll(), GiveMemoryBack()]
        )
    )
