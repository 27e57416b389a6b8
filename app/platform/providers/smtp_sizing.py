"""How many SMTP connections a worker process holds (the policy; the pools in smtp_async.py and
smtp.py apply it).

Three rules, each answering a way the pool used to go wrong (it sized batches by Little's law on a
latency that included CPU queueing, so on a busy host every process grew to SMTP_POOL_MAX and kept
it; idle connections were never closed; a relay's 421 only failed mails):

- **Grow only while it pays** (LaneSizer, the async pool). The pool starts at SMTP_POOL_SIZE. Over
  short windows it measures mails per second (Little's law: connections in use / seconds each mail
  holds one). When lanes waited for a connection it tries a step up and keeps it only if the
  throughput rose by GAIN_PER_DOUBLING per doubling of connections; otherwise it goes back and waits
  before trying again (HOLD_MIN_SECONDS, doubling up to HOLD_MAX_SECONDS). Steps are big only to a
  far relay, one whose every mail takes FAR_ROUND_TRIP or more beyond what the event loop's own
  lateness explains (a heartbeat samples it: threads that hold the GIL delay every reply alike):
  there the round trip, not this host's CPU, sets the rate, and a relay 50 ms away is filled in a
  few round trips. A relay next door gets doublings, none while the process is at one core (the
  GIL's limit) or the host has no idle CPU (app/platform/host.py), so the CPU being the bottleneck
  there, the pool stays at its floor. A gain that is not clear is confirmed by one more window; a
  step that paid less than half of what it cost is refined to the middle; above its floor the pool
  tries fewer connections now and then and keeps them when throughput held.
- **Stop where the relay refuses, and remember it** (RelayCeiling, both pools). A relay that
  refuses one more connection (421 or "too many connections" at the greeting or EHLO, a connect
  refused or reset) while this process holds N is taken at its word: N is this process's most for
  REPROBE_AFTER_SECONDS, then it rises by a tenth at a time. The refused lane waits for one of the
  pool's connections; no mail fails for it. Refusals of connects begun before the decrease do not
  lower it again, and connects run a few at a time (CONNECT_BURST), so learning a limit costs a
  handful of refusals. A refusal with nothing of ours open is an outage, not a limit.
- **Give back what is idle.** Connections unused for SMTP_IDLE_TIMEOUT_SECONDS are closed (QUIT).

A stock Postfix accepts 50 connections per client (smtpd_client_connection_count_limit): the
default floor (8 per process, 16 for the Procfile's two workers) fits under it, a relay next door
never needs more, and growth towards a far one stops at the first refusal.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.platform import host
from app.platform.providers.base import TransientError

log = logging.getLogger("app.platform.providers.smtp_sizing")

WINDOW_MIN_SECONDS = 0.05  # a judgement covers at least this long, WINDOW_MIN_MAILS mails and one mail
WINDOW_MIN_MAILS = 8  # per connection allowed
GAIN_PER_DOUBLING = 0.2  # a step up is kept when throughput rose this much per doubling of connections,
MIN_GAIN = 0.05  # and at least this much
CLEAR_GAIN = 3.0  # a gain below this many times the one needed is confirmed by one more window
MAX_LOSS = 0.05  # a step down is kept when throughput fell less than this
STEADY = 0.8  # a step starts from two windows within this ratio of each other (one window
# is enough when the relay is far)
FAR_ROUND_TRIP = 0.01  # the relay is far when even the quickest mail of a window took this long (three
EVEN = 0.5  # times this while the process is busy) and at least EVEN of the mean: the
# relay's round trip, not this host's CPU, sets the rate. A process starved of
# the CPU or the GIL also makes every mail slow, but unevenly.
LOOP_TURNS = 2  # a mail waits for the loop once for the envelope's replies and once for the data's
CPU_BUSY = 0.8  # the process used this share of a core (the GIL's limit is one): busy
HOST_IDLE_MIN = 0.1  # ... or the host had less than this share of its CPU idle: busy too
FAR_STEP = 4.0  # the step up from one far window; from two in a row CPU_TARGET / the event
MAX_STEP = 32.0  # loop's CPU share, up to MAX_STEP (an overshoot the judgement refines); from
CPU_TARGET = 2.0  # a relay that is not far MIN_STEP, and none while the process is busy
MIN_STEP = 2.0
DOWN_STEP = 0.85
HOLD_MIN_SECONDS = 1.0  # after a step that did not pay, the next waits this long, twice as long after
HOLD_MAX_SECONDS = 300.0  # each further one, up to this
REPROBE_AFTER_SECONDS = 300.0
CONNECT_BURST = 8  # connections being opened at once per process, or half of those open if more,
SMALL_LIMITS = 64  # or as many as are open past this: bounds the refusals learning a limit costs
# (Postfix allows 50 per client, Exchange 20) and still fills a big step fast

_LIMIT_WORDS = re.compile(r"too many|connection limit|concurrent|maximum number", re.IGNORECASE)


class RelayRefused(TransientError):
    """The relay refused a new connection (421 at the greeting, too many connections, refused or
    reset at connect): a limit when this process already holds connections, an outage when not."""


def refuses_connections(code: int, text: str) -> bool:
    """A reply to the greeting or to EHLO that means "no more connections from you"."""
    return code == 421 or (code >= 400 and bool(_LIMIT_WORDS.search(text or "")))


class RelayCeiling:
    """The most connections the relay accepted from this process, learned from its refusals."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._value: int | None = None
        self._since = 0.0
        self.epoch = 0  # bumped by every decrease; attempts carry the epoch they began in
        self.refusals = 0  # refused connection attempts seen (for tests and logs)

    def current(self) -> int | None:
        """None: no limit seen. After REPROBE_AFTER_SECONDS without a refusal it rises by a tenth
        (at least one), and again after each further period."""
        if self._value is not None:
            now = self._clock()
            if now - self._since >= REPROBE_AFTER_SECONDS:  # the limit may have been lifted: one step
                self._value += max(1, self._value // 10)
                self._since = now
        return self._value

    def accepted(self, established: int, epoch: int) -> None:
        """An attempt begun before the last decrease got through after all: the relay takes at least
        `established` (the refusal that lowered the ceiling overtook this connect's greeting)."""
        if self._value is not None and epoch != self.epoch and established > self._value:
            self._value = established

    def forget(self) -> None:
        """The relay refused us with nothing of ours open (down, restarting, or full with other
        clients): what it refused before may have been that too, so no limit is kept."""
        if self._value is not None:
            self._value = None
            self.epoch += 1

    def refused(self, established: int, epoch: int) -> bool:
        """An attempt begun in `epoch` was refused while this process held `established`
        connections. True when that lowered the ceiling."""
        self.refusals += 1
        if epoch != self.epoch:
            return False
        self._value = max(1, established if self._value is None else min(established, self._value - 1))
        self._since = self._clock()
        self.epoch += 1
        return True


@dataclass
class _Trial:
    kind: str  # up | confirm (one more window after a marginal up) | refine | down
    before: int  # the limit before the step ...
    before_rate: float  # ... and the throughput it gave
    far: bool = False  # the relay was far before the step
    level: int = 0  # confirm: the step's limit ...
    rate: float = 0.0  # ... and its throughput


class LaneSizer:
    """The async pool's connection limit, judged on measured throughput. Not thread-safe: every call
    comes from the pool's event loop thread."""

    _mails: int
    _busy: int
    _seconds: float
    _quickest: float
    _waited: bool
    _late: float

    def __init__(
        self,
        floor: int,
        cap: int,
        ceiling: RelayCeiling | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        loop_cpu: Callable[[], float] = time.thread_time,
        host_idle: Callable[[], float] = host.host_idle.share,
    ) -> None:
        self.floor, self.cap = max(1, floor), max(1, floor, cap)
        self.ceiling = ceiling or RelayCeiling(clock)
        self.level = self.floor
        self.latency = 0.0  # seconds per mail transaction, EWMA (informational)
        self.steps: list[tuple[int, int, bool]] = []  # recent judgements (from, to, kept), for logs and tests
        self._clock, self._cpu, self._loop_cpu, self._host_idle = clock, cpu, loop_cpu, host_idle
        self._trial: _Trial | None = None
        self._next = "up"
        self._hold, self._hold_until = HOLD_MIN_SECONDS, 0.0
        self._rates: list[float] = []  # saturated windows at the current limit since it last changed
        self._far_before = False  # the previous window found the relay far
        self._could_grow = True  # the previous window allowed a step up
        self._settling = False  # after a change, the window starts once the connections are open
        self._start: float | None = None
        self._begin()
        self._start = None

    def limit(self) -> int:
        """Connections this process may hold now."""
        ceiling = self.ceiling.current()
        return self.level if ceiling is None else max(1, min(self.level, ceiling))

    def may_grow(self) -> bool:
        """False while no step up will be tried (held back after one that did not pay, or the last
        window had the CPU as its bottleneck): a batch then needs no more lanes than the limit."""
        return self._trial is not None or (self._could_grow and self._clock() >= self._hold_until)

    @property
    def settling(self) -> bool:
        return self._settling

    # -- inputs -------------------------------------------------------------------------------
    def delivered(self, seconds: float, busy: int, waiting: bool, settled: bool = True) -> bool:
        """A mail was accepted after `seconds` on its connection; `busy` connections are in use,
        `waiting`: lanes wait for one; `settled`: none is being opened or closed for the current
        limit. True when the limit changed."""
        self.latency = seconds if not self.latency else self.latency + 0.05 * (seconds - self.latency)
        if self._settling:
            if not settled:
                return False
            self.settled()
        start = self._begin() if self._start is None else self._start
        self._mails += 1
        self._busy += busy
        self._seconds += seconds
        self._quickest = min(self._quickest, seconds)
        self._waited = self._waited or waiting
        limit = self.limit()
        if self._mails < max(WINDOW_MIN_MAILS, limit):
            return False
        now = self._clock()
        elapsed = now - start
        if elapsed < WINDOW_MIN_SECONDS:
            return False
        # Mails per second by Little's law: connections in use / seconds a mail holds one. Counting
        # the mails of a short window would swing with the phase of the replies, which arrive in
        # bursts when every connection waits out the same round trip.
        rate = self._busy / max(self._seconds, 1e-9)
        loop_share = (self._loop_cpu() - self._loop0) / elapsed
        # Busy: this process at the GIL's limit, or a host without idle CPU, where a window's rate
        # swings with what other processes do and more connections only queue for the CPU.
        cpu_busy = (self._cpu() - self._cpu0) / elapsed >= CPU_BUSY or self._host_idle() < HOST_IDLE_MIN
        # The loop's own lateness is in every mail's time: a reply may wait that long for the loop
        # at each of a mail's LOOP_TURNS. Other threads holding the GIL (rendering a batch) make
        # every mail to a relay next door take tens of ms, evenly, like a far relay's round trip.
        slow = self._quickest - LOOP_TURNS * self._late >= FAR_ROUND_TRIP * (3 if cpu_busy else 1)
        far, saturated = slow and self._quickest >= EVEN * self._seconds / self._mails, self._waited
        self._begin()
        changed = self._judge(rate, loop_share, cpu_busy, far, slow, saturated, limit, now)
        self._far_before, self._could_grow = far, far or not cpu_busy
        return changed

    def loop_late(self, seconds: float) -> None:
        """The pool's heartbeat timer ran, or is still waiting to run, `seconds` after it was due."""
        self._late = max(self._late, seconds)

    def waited(self) -> None:
        """A lane had to wait for a connection: more work than connections."""
        self._waited = True

    def settled(self) -> None:
        """The connections for the current limit are open (or closed): the next window starts now."""
        if self._settling:
            self._settling = False
            self._begin()

    def paused(self) -> None:
        """Nothing in flight: the next window starts when a lane takes a connection again."""
        self._start = None

    def resumed(self) -> None:
        """A lane takes a connection: the window starts now if nothing was in flight."""
        if self._start is None and not self._settling:
            self._begin()

    def refused(self, established: int, epoch: int) -> bool:
        """A connection attempt begun in `epoch` was refused while `established` were open. True
        when the limit went down."""
        if not self.ceiling.refused(established, epoch):
            return False
        self._settling = True
        return True

    # -- the decision -------------------------------------------------------------------------
    def _begin(self) -> float:
        """A new window, from now; returns its start."""
        self._start, self._cpu0, self._loop0, self._waited = self._clock(), self._cpu(), self._loop_cpu(), False
        self._mails, self._busy, self._seconds, self._quickest = 0, 0, 0.0, math.inf
        self._late = 0.0
        return self._start

    def _judge(
        self,
        rate: float,
        loop_share: float,
        cpu_busy: bool,
        far: bool,
        slow: bool,
        saturated: bool,
        limit: int,
        now: float,
    ) -> bool:
        """One window: `rate` mails/s at `limit`; `loop_share` of a core used by the event loop's
        thread; `cpu_busy`: the whole process near one core (the loop shares the GIL with the
        threads that render and claim); `far`: the relay's round trip sets the rate; `slow`: every
        mail took FAR_ROUND_TRIP (at a step from a far relay, that is enough: the new connections'
        first mails may be uneven); `saturated`: lanes waited for a connection, so the connections
        (not the amount of work) set the rate."""
        trial = self._trial
        log.debug(
            "window: limit %d, %.0f mails/s, loop CPU %.2f, busy %s, far %s, saturated %s, trial %s",
            limit,
            rate,
            loop_share,
            cpu_busy,
            far,
            saturated,
            trial,
        )
        if trial is None:
            if not saturated:
                return False
            # A step starts from a steady rate: two windows that agree. A window in which the
            # rendering threads held the GIL, or another process the CPU, must not pass for the
            # limit's throughput and make a step look good.
            self._rates = (self._rates + [rate])[-2:]
            steady = len(self._rates) == 2 and min(self._rates) >= STEADY * max(self._rates)
            if now < self._hold_until or not (steady or far):
                return False
            return self._probe(max(self._rates), loop_share, cpu_busy, far, limit)
        if trial.kind == "up":
            if limit <= trial.before:
                self._trial = None
                return False  # a refusal cut the step short: the ceiling decided instead
            need = max(MIN_GAIN, GAIN_PER_DOUBLING * math.log2(limit / trial.before))
            if rate >= trial.before_rate * (1 + CLEAR_GAIN * need) and trial.far and slow:
                # Clearly paid: keep it and, unless it paid little, go on from this window at once.
                return self._kept(trial.before, trial.before_rate, limit, rate) or (
                    self._trial is None and self._probe(rate, loop_share, cpu_busy, far, limit)
                )
            if rate < trial.before_rate * (1 + need):
                if not saturated:
                    return False
                middle = round(math.sqrt(trial.before * limit))
                if rate >= trial.before_rate * (1 + GAIN_PER_DOUBLING) and trial.before < middle < limit:
                    # It paid, less than so big a step must: the knee lies between. Try the middle.
                    self.steps = (self.steps + [(trial.before, limit, False)])[-32:]
                    self._trial = _Trial("up", trial.before, trial.before_rate, trial.far)
                    self.level, self._settling = middle, True
                    return True
                return self._undo(trial.before, limit, "down", now)
            # A marginal gain may be the host's load drifting. From a far relay one more window at
            # the new limit must agree; otherwise the old limit is measured once more and the step
            # is kept only if it beats both measurements.
            self._trial = _Trial("confirm", trial.before, trial.before_rate, trial.far and slow, limit, rate)
            if self._trial.far:
                return False
            self.level, self._settling = trial.before, True
            return True
        if not saturated:
            return False  # too little work to tell: judge on a later window
        if trial.kind == "confirm":
            need = max(MIN_GAIN, GAIN_PER_DOUBLING * math.log2(trial.level / trial.before))
            if trial.far:  # this window was at the new limit too
                if min(trial.rate, rate) >= trial.before_rate * (1 + need):
                    return self._kept(trial.before, trial.before_rate, trial.level, min(trial.rate, rate))
                return self._undo(trial.before, trial.level, "down", now)
            if trial.rate >= max(trial.before_rate, rate) * (1 + need):
                self.level, self._settling = trial.level, True
                self._kept(trial.before, max(trial.before_rate, rate), trial.level, trial.rate)
                return True
            return self._undo(trial.before, trial.level, "down", now, moved=False)
        if rate < trial.before_rate * (1 - MAX_LOSS):
            return self._undo(trial.before, limit, "up", now)
        self._trial, self._rates = None, [rate]
        self.steps = (self.steps + [(trial.before, limit, True)])[-32:]
        if trial.kind == "refine":
            self._next = "up"  # the knee lies above: the next step up will tell (or hold back)
        else:
            self._next = "down"  # fewer did as well: try fewer still
        return False

    def _probe(self, rate: float, loop_share: float, cpu_busy: bool, far: bool, limit: int) -> bool:
        ceiling = self.ceiling.current()
        cap = self.cap if ceiling is None else min(self.cap, ceiling)
        if self._next == "up" and limit >= cap:
            # At the most it may hold: fewer may do as well, but try that only after a while.
            self._next, self._hold_until = "down", self._clock() + self._hold
            return False
        if self._next == "up" and (far or not cpu_busy):
            if far and self._far_before:
                step = min(MAX_STEP, max(MIN_STEP, CPU_TARGET / max(loop_share, 1e-6)))
            else:
                step = FAR_STEP if far else MIN_STEP
            return self._try("up", min(cap, math.ceil(limit * step)), rate, far)
        if limit > self.floor:
            return self._try("down", max(self.floor, int(limit * DOWN_STEP)), rate, far)
        self._next = "up"  # at the floor with the CPU busy: nothing to try now
        return False

    def _kept(self, before: int, before_rate: float, limit: int, rate: float) -> bool:
        """An up-step from `before` to `limit` paid: keep it, and go on up unless it paid little."""
        self._trial, self._rates = None, [rate]
        self.steps = (self.steps + [(before, limit, True)])[-32:]
        self._hold = HOLD_MIN_SECONDS
        paid = (rate / before_rate - 1) / max(1e-9, limit / before - 1)
        middle = round(math.sqrt(before * limit))
        if paid < 0.5 and before < middle < limit:
            # More than half of the step bought nothing: the knee lies between. Try the geometric
            # middle, keep it if throughput holds.
            return self._try("refine", middle, rate, False)
        self._next = "up"
        return False

    def _undo(self, before: int, limit: int, next_probe: str, now: float, moved: bool = True) -> bool:
        """The step from `before` to `limit` did not pay: back, and wait longer before the next."""
        self._trial, self._rates = None, []
        self.steps = (self.steps + [(before, limit, False)])[-32:]
        self.level, self._next = before, next_probe
        self._settling = self._settling or moved
        self._hold_until = now + self._hold
        self._hold = min(self._hold * 2, HOLD_MAX_SECONDS)
        return moved

    def _try(self, kind: str, level: int, rate: float, far: bool) -> bool:
        self._trial, self._rates = _Trial(kind, self.limit(), rate, far), []
        self.level, self._settling = level, True
        return True
