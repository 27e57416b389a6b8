"""actors/broker.py GracefulStop: a worker process stops once on SIGTERM and finishes its in-flight
work. The copy of the same SIGTERM that Dramatiq's parent forwards a moment later is not news (one
Ctrl-C under honcho logged "SIGTERM again" every time); a SIGTERM sent later is answered in the log."""

from __future__ import annotations

import importlib
import logging
import signal

# The module, not `actors.broker` the attribute (the Redis broker the package exposes under that name).
broker = importlib.import_module("actors.broker")


def test_the_forwarded_echo_is_quiet_and_a_later_sigterm_is_logged(caplog):
    caplog.set_level(logging.WARNING, logger="actors.broker")
    now = [100.0]
    stops = []
    once = broker.stop_once(lambda signum, frame: stops.append(signum), clock=lambda: now[0])
    assert once.graceful

    once(signal.SIGTERM, None)
    now[0] += 0.05
    once(signal.SIGTERM, None)  # the parent's forwarded copy
    assert stops == [signal.SIGTERM] and "SIGTERM again" not in caplog.text

    now[0] += broker.ECHO_SECONDS + 1
    once(signal.SIGTERM, None)  # someone asks again
    assert stops == [signal.SIGTERM] and "SIGTERM again: still finishing in-flight work" in caplog.text
