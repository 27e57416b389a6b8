"""How many SMTP connections a worker process holds (app/platform/providers/smtp_sizing.py and the pools in
smtp_async.py / smtp.py): grown only while it raises throughput, stopped where the relay refuses and
kept there, idle ones closed. The policy first, against a model of a relay (no sockets, a fake
clock), then the pools against real local SMTP servers, one of them capping connections per client
like a stock Postfix."""

from __future__ import annotations

import collections
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.platform import config, providers
from app.platform.providers import smtp_sizing
from app.platform.providers.base import OutgoingMail, TransientError
from app.platform.providers.smtp import SMTPProvider
from app.platform.providers.smtp_sizing import CONNECT_BURST, LOOP_TURNS, LaneSizer, RelayCeiling, refuses_connections
from tests.digest_support import SmtpSink, free_port

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)


@pytest.fixture(autouse=True)
def _close_providers():
    yield
    providers.close_all()


# -- the policy, against a model relay --------------------------------------------------------
class ModelRelay:
    """Feeds a LaneSizer what a pool would see: a relay `round_trip` seconds away and a host that
    can process at most `capacity` mails/s; at that rate the sending process uses `cpu_cost` of a
    core (the rest of the host: Postgres, the relay, other processes) and its event loop `loop_cost`
    (the rest of the process: threads rendering mail); `demand` lanes want a connection. Time is
    fake."""

    def __init__(
        self,
        round_trip: float,
        capacity: float,
        demand: int = 10_000,
        floor: int = 8,
        cap: int = 256,
        cpu_cost: float = 0.6,
        loop_cost: float = 0.3,
        host_idle: float = 0.5,
        loop_late: float = 0.0,
        threads_cpu: float = 0.0,
    ):
        self.now = 0.0
        self.loop_late = loop_late  # how late the event loop gets to each turn (other threads hold the GIL)
        self.threads_cpu = threads_cpu  # the share of a core the process's other threads use, whatever the rate
        self.round_trip, self.capacity, self.demand = round_trip, capacity, demand
        self.cpu_cost, self.loop_cost = cpu_cost, loop_cost
        self.cpu = self.loop_cpu = 0.0
        self.host_idle = host_idle
        self.sizer = LaneSizer(
            floor,
            cap,
            clock=lambda: self.now,
            cpu=lambda: self.cpu,
            loop_cpu=lambda: self.loop_cpu,
            host_idle=lambda: self.host_idle,
        )
        self.ceiling = self.sizer.ceiling
        self.ceiling._clock = lambda: self.now
        self.most = 0

    def run(self, seconds: float) -> LaneSizer:
        end = self.now + seconds
        while self.now < end:
            limit = self.sizer.limit()
            self.most = max(self.most, limit)
            busy = min(limit, self.demand)
            # queueing once the client is the bottleneck; a late loop delays each of a mail's turns
            took = max(self.round_trip, busy / self.capacity) + LOOP_TURNS * self.loop_late
            rate = busy / took
            self.now += 1 / rate
            self.cpu += self.cpu_cost / self.capacity + self.threads_cpu / rate
            self.loop_cpu += self.loop_cost / self.capacity
            self.sizer.loop_late(self.loop_late)  # the pool's heartbeat
            self.sizer.delivered(took, busy, waiting=self.demand > limit)
        return self.sizer


def test_a_relay_far_away_gets_connections_up_to_where_the_client_is_the_bottleneck():
    """50 ms round trip, a client good for 4,000 mails/s: 200 connections carry it; more would only
    queue. The pool climbs there within a second and does not sit at its maximum."""
    relay = ModelRelay(round_trip=0.05, capacity=4000)
    relay.run(1.0)
    assert relay.sizer.limit() >= 150
    relay.run(60)
    assert 150 <= relay.sizer.limit() <= 230
    assert relay.most <= 256


def test_a_relay_next_door_keeps_the_floor():
    """0.2 ms round trip: 8 connections already carry more than the host's CPU can, so every step
    up is judged useless and undone, and the steps become rarer (HOLD_*)."""
    relay = ModelRelay(round_trip=0.0002, capacity=1000)
    relay.run(600)
    assert relay.sizer.limit() == 8 and relay.most == 16
    tried = [step for step in relay.sizer.steps if step[1] > step[0]]
    assert tried and not any(kept for _, _, kept in tried)
    assert len(tried) <= 12  # ten minutes: 1 + 2 + 4 + ... seconds apart, then every 5 minutes
    busy = ModelRelay(round_trip=0.0002, capacity=1000, cpu_cost=0.95)  # the process is the bottleneck (GIL)
    busy.run(60)
    assert busy.most == 8 and busy.sizer.steps == []  # not even tried


def test_a_busy_host_gives_a_relay_next_door_no_more_connections_even_when_a_step_looks_good():
    """Other processes hold the CPU (the host has no idle share): this process's windows swing with
    them, and a step that happens to land in a quiet moment must not pass for one that paid. Here
    every step up would double the throughput: none is tried while the host is busy, and growth
    starts once it has idle CPU again. Far relays are judged on their round trip, busy host or not."""
    relay = ModelRelay(round_trip=0.0002, capacity=100_000, cpu_cost=0.3, host_idle=0.02)
    relay.run(120)
    assert relay.most == 8 and relay.sizer.steps == []
    relay.host_idle = 0.5
    relay.run(10)
    assert relay.sizer.limit() > 8
    far = ModelRelay(round_trip=0.05, capacity=4000, host_idle=0.0)
    far.run(60)
    assert 150 <= far.sizer.limit() <= 230


def test_an_event_loop_starved_by_rendering_threads_does_not_make_a_relay_next_door_look_far():
    """Threads rendering a batch hold the GIL: the loop gets a turn every 20 ms, so every mail to a
    relay next door takes 40 ms, evenly, as a far relay's would. The heartbeat's lateness explains
    it: no far step (the pool used to try 4x its floor here). A far relay seen through the same
    starved loop is still far."""
    starved = ModelRelay(round_trip=0.0002, capacity=1000, loop_late=0.02, threads_cpu=0.9)
    starved.run(60)
    assert starved.most == 8 and starved.sizer.steps == []
    far = ModelRelay(round_trip=0.05, capacity=4000, loop_late=0.01, threads_cpu=0.9)
    far.run(60)
    assert far.sizer.limit() >= 100


def test_the_knee_is_found_when_the_client_saturates_midway():
    relay = ModelRelay(round_trip=0.05, capacity=1000)  # 50 connections carry it
    relay.run(60)
    assert 40 <= relay.sizer.limit() <= 75


def test_growth_stops_at_the_max_and_with_the_work():
    relay = ModelRelay(round_trip=0.05, capacity=100_000, cap=64)
    relay.run(10)
    assert relay.sizer.limit() == 64 and relay.most == 64
    few = ModelRelay(round_trip=0.05, capacity=100_000, demand=5)  # five lanes of work: no lane ever waits
    few.run(10)
    assert few.sizer.limit() == 8 and few.sizer.steps == []


def test_a_refusal_sets_a_ceiling_that_growth_respects_until_it_is_probed_again_slowly():
    relay = ModelRelay(round_trip=0.05, capacity=100_000)
    assert relay.sizer.refused(30, relay.ceiling.epoch)
    relay.run(60)
    assert relay.sizer.limit() == 30 and relay.most <= 30
    relay.run(smtp_sizing.REPROBE_AFTER_SECONDS - 61)
    assert relay.ceiling.current() == 30
    relay.run(2)
    assert relay.ceiling.current() == 33  # a tenth more after five quiet minutes ...
    relay.run(smtp_sizing.HOLD_MAX_SECONDS)
    assert 30 < relay.sizer.limit() <= relay.ceiling.current() <= 36  # ... which growth then uses


def test_refusals_of_attempts_begun_before_the_decrease_do_not_lower_it_again():
    ceiling = RelayCeiling(clock=lambda: 0.0)
    epoch = ceiling.epoch
    assert ceiling.refused(20, epoch) and ceiling.current() == 20
    assert not ceiling.refused(19, epoch) and not ceiling.refused(18, epoch)  # the same burst of connects
    assert ceiling.current() == 20 and ceiling.refusals == 3
    assert ceiling.refused(20, ceiling.epoch) and ceiling.current() == 19  # a later one: one less
    ceiling.forget()
    assert ceiling.current() is None


def test_which_replies_mean_no_more_connections():
    assert refuses_connections(421, "4.7.0 Error: too many connections from 10.0.0.1")
    assert refuses_connections(554, "5.7.1 Too many concurrent SMTP connections")
    assert refuses_connections(450, "4.7.1 Connection limit exceeded")
    assert not refuses_connections(554, "5.7.1 Access denied")
    assert not refuses_connections(250, "too many")


# -- the pools, against real local servers -------------------------------------------------------
def _mails(n: int, prefix: str) -> list[OutgoingMail]:
    return [
        OutgoingMail(
            to=f"user{i}@example.test",
            subject=f"s{i}",
            html=f"<p>{i}</p>",
            text=str(i),
            idempotency_key=f"{prefix}-{i}",
        )
        for i in range(n)
    ]


def _message_ids(sink: SmtpSink) -> collections.Counter:
    with sink.lock:
        return collections.Counter(
            re.search(rb"(?mi)^Message-ID: <([^>]+)>", raw).group(1).decode() for raw in sink.raw
        )


def _send_all(provider: SMTPProvider, batches: list[list[OutgoingMail]], retried: collections.Counter) -> list[str]:
    """What a caller does: send each batch, send again what failed transiently (same idempotency
    key, same Message-ID). The Message-IDs the provider reported as accepted."""
    accepted = []
    for batch in batches:
        for _ in range(10):
            results = provider.send_batch(batch)
            accepted += [r.message_id for r in results if r.ok]
            batch = [m for m, r in zip(batch, results) if not r.ok]
            retried["mails"] += len(batch)
            if not batch:
                break
    return accepted


def _in_threads(*jobs):
    errors = []

    def run(job):
        try:
            job()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.alone("the pools' sizers judge on throughput: other tests' CPU would look like a slow relay")
def test_two_worker_processes_share_a_postfix_cap_of_50_without_a_storm_of_refusals():
    """Two pools with the default settings (two worker processes) against a relay that answers 421
    to a 51st connection from this host, 50 ms per mail: every mail goes exactly once; the pools
    learn the limit with a few refusals each and do not climb back into it on later batches."""
    defaults, settings = config.Settings(), config.get()
    assert (settings.smtp_pool_size, settings.smtp_pool_max) == (defaults.smtp_pool_size, defaults.smtp_pool_max)
    sink = SmtpSink(max_connections=50).start()
    sink.delay = 0.05
    pools = [SMTPProvider(sink.url, use_async=True) for _ in range(2)]
    accepted, retried = [[], []], collections.Counter()

    def send(k: int, *rounds: str) -> None:
        accepted[k].extend(_send_all(pools[k], [_mails(600, f"p{k}-{r}") for r in rounds], retried))

    try:
        _in_threads(lambda: send(0, "a", "b"), lambda: send(1, "a", "b"))
        learned = sink.refused
        # The limit was reached, and learned at once: a pool holding N connections opens
        # max(CONNECT_BURST, N // 2) at a time (AsyncPool._burst), the relay may refuse that whole
        # burst, and a later refusal (a connect begun after the decrease) costs one more and lowers
        # the limit by one. So each pool pays about one burst at the limit it learned.
        limits = [pool._async.sizer.ceiling.current() for pool in pools]
        assert all(limit is not None and limit < 50 for limit in limits), limits
        assert 1 <= learned <= sum(max(CONNECT_BURST, limit // 2) + 3 for limit in limits), (learned, limits)
        _in_threads(lambda: send(0, "c"), lambda: send(1, "c"))
        assert sink.refused - learned <= 2  # remembered: later batches stay under it
        ids = _message_ids(sink)
        assert len(ids) == 2 * 1800 and set(ids.values()) == {1}  # every mail, exactly once
        assert sorted(ids) == sorted(accepted[0] + accepted[1])
        assert retried["mails"] == 0  # a refused connection fails no mail
        assert sink.peak_connections == 50
        assert sum(p._async._pool.open for p in pools) <= 50
    finally:
        for p in pools:
            p.close()
        sink.stop()


@pytest.mark.parametrize("use_async", [True, False], ids=["async", "threads"])
def test_a_relay_that_takes_fewer_connections_than_the_floor_is_kept_at_its_limit(settings, use_async):
    """SMTP_POOL_SIZE 12 against a relay that takes 5: a few refusals, then the pool stays at 5 and
    a second round refuses nothing; no mail fails for it."""
    settings(smtp_pool_size=12)
    sink = SmtpSink(max_connections=5).start()
    sink.delay = 0.02
    p = SMTPProvider(sink.url, use_async=use_async)
    if not use_async:
        p._latency = 1.0  # the threaded pool: use every connection it may
    retried = collections.Counter()
    try:
        _send_all(p, [_mails(200, "first")], retried)
        learned = sink.refused
        assert 1 <= learned <= CONNECT_BURST + 8
        _send_all(p, [_mails(200, "second"), _mails(200, "third")], retried)
        assert sink.refused == learned
        assert retried["mails"] == 0 and len(set(_message_ids(sink).values())) == 1 and len(sink.raw) == 600
        pool = p._async.sizer if use_async else p._threaded
        assert pool.limit() == 5
    finally:
        p.close()
        sink.stop()


class LoopbackRelay:
    """The benchmarks' SMTP sink (scripts/bench/smtp_sink.py) in a process of its own: a relay next
    door that answers at once and does not share this process's CPU or GIL."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).parents[2] / "scripts/bench/smtp_sink.py"), "--port", str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"
        self.url = f"smtp://127.0.0.1:{self.port}"

    def stop(self) -> dict:
        """Its counters: received, connections (opened), peak_connections (most open at once)."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(next(line for line in out.splitlines() if line.startswith("stats "))[6:])


@pytest.mark.alone("the pool sizer judges on throughput: other tests' CPU would look like a slow relay")
@pytest.mark.parametrize("use_async", [True, False], ids=["async", "threads"])
def test_a_fast_local_relay_keeps_the_pool_small(use_async):
    """A relay next door at the default settings, four sending threads (send chains) of 1,000-mail
    batches: the CPU is the bottleneck, more connections do not raise throughput, so the pool stays
    at SMTP_POOL_SIZE. A step up may be tried (and, on a noisy host, kept for a while: it is judged
    on throughput), never far: the pool used to grow to SMTP_POOL_MAX (256) here."""
    size = config.get().smtp_pool_size
    relay = LoopbackRelay()
    p = SMTPProvider(relay.url, use_async=use_async)
    retried = collections.Counter()
    try:
        _in_threads(
            *(lambda k=k: _send_all(p, [_mails(1000, f"t{k}-{b}") for b in range(2)], retried) for k in range(4))
        )
        if use_async:
            sizer = p._async.sizer
            assert max([sizer.limit(), *(to for _, to, _ in sizer.steps)]) <= 2 * size, sizer.steps
            assert p._async._pool.open <= 2 * size
    finally:
        p.close()
        stats = relay.stop()
    assert stats["received"] == 8000 and retried["mails"] == 0
    assert stats["peak_connections"] <= 4 * size


@pytest.mark.parametrize("use_async", [True, False], ids=["async", "threads"])
def test_idle_connections_close_after_the_idle_timeout(settings, use_async):
    """Connections unused for SMTP_IDLE_TIMEOUT_SECONDS are closed (QUIT); a pool with the default
    timeout keeps its own open meanwhile; the next batch opens new ones."""
    sink = SmtpSink().start()
    kept = SMTPProvider(sink.url, pool_size=2, use_async=use_async)
    settings(smtp_idle_timeout_seconds=0.2)
    brief = SMTPProvider(sink.url, pool_size=3, use_async=use_async)
    assert kept.idle_timeout == config.Settings().smtp_idle_timeout_seconds == 30.0
    if not use_async:
        kept._latency = brief._latency = 1.0
    try:
        assert all(r.ok for r in kept.send_batch(_mails(20, "kept")) + brief.send_batch(_mails(30, "brief")))
        deadline = time.monotonic() + 30
        while _open(brief) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _open(brief) == 0
        assert _open(kept) == 2
        while sink.open_connections > 2 and time.monotonic() < deadline:  # the sink sees them go
            time.sleep(0.05)
        assert sink.open_connections == 2
        assert all(r.ok for r in brief.send_batch(_mails(3, "again")))
    finally:
        kept.close()
        brief.close()
        sink.stop()


def _open(p: SMTPProvider) -> int:
    """Connections the provider's pool holds open (an int read; the pool's thread keeps it)."""
    if p.use_async:
        return p._async._pool.open
    with p._threaded._lock:
        return p._threaded._open()


def test_a_refused_connect_with_nothing_open_is_an_unreachable_relay():
    """A relay that refuses even the first connection is unreachable (TransientError for the
    batch), not a limit to remember."""
    sink = SmtpSink(max_connections=0).start()
    p = SMTPProvider(sink.url, use_async=True)
    try:
        with pytest.raises(TransientError, match="cannot connect"):
            p.send_batch(_mails(5, "x"))
        assert p._async.sizer.ceiling.current() is None and sink.refused >= 1
    finally:
        p.close()
        sink.stop()
