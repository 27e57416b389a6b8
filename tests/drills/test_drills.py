"""Small versions of the fault drills (scripts/drill.py; `make drill` runs them at full scale and
pace): the real Procfile processes on their own Postgres and Redis, one fault each, with the
shorter windows and timeouts of drill.QUICK. No mail is lost, none is
sent twice under two Message-IDs, and the only repeats are mail a SIGKILLed worker had already
handed to the relay (same Message-ID): at most 25 per worker thread and kill.

They share the machine with the rest of the suite: every fault waits for progress (a share of the
mail delivered, a killed worker's successor delivering), never for a moment on the clock, so a busy
machine makes a drill slower, not different. provider_failover's switch time is printed, not judged
here (drill.QUICK.judge_timing); that mail went back to the primary after its outage is judged (the
send is held to a rate that outlasts the outage and the breaker's cool-down)."""

from __future__ import annotations

import glob
import shutil

import pytest

from scripts import drill

pytestmark = [
    pytest.mark.slow,
    pytest.mark.not_pooled("each drill starts its own Postgres and Redis"),
    pytest.mark.skipif(
        not (shutil.which("redis-server") and glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        reason="the drills start their own postgres and redis-server (apt-get install postgresql redis-server)",
    ),
]
SCALE, DELAY_MS = 0.01, 50


@pytest.mark.parametrize("name", sorted(drill.DRILLS))
def test_drill(name):
    (report,) = drill.run([name], SCALE, DELAY_MS, drill.QUICK)
    assert report.expected > 0 and report.sent == report.expected, report.line()
    assert report.ok, report.line()
    assert report.faults > 0, f"the fault never happened: {report.line()}"
    if name not in drill.KILL_WORKERS:
        assert report.resent_after_kill == 0, report.line()
    else:  # what a killed worker had handed over unrecorded: a few per thread (issue 37)
        bound = drill.RESENT_PER_THREAD_MAX * drill.WORKER_THREADS * report.faults
        assert report.resent_after_kill <= bound, report.line()
