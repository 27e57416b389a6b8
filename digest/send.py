"""Claim → build → send → record, for one batch of digest runs: the body of build_and_send_digest.

One call handles a batch (DIGEST_CLAIM_BATCH) so the fixed costs — a claim query, one event query,
one final transaction, pooled SMTP connections — are paid once per batch. It is built and sent in
slices of about DIGEST_BUILD_EVENTS loaded events (one details query and one link statement each),
so a thread holds one slice's mails at a time; a batch of ordinary digests is one slice.

Failure isolation: every outcome is per run.
  - one run's own problem (its data cannot be rendered, its address or headers cannot be built,
    the provider refuses that recipient) fails or retries that run alone: permanent problems end
    `failed` at once, the others are retried with backoff and counted;
  - a problem of the whole call (provider down, throttled, connection lost, an unexpected error in
    the provider) retries every run of the call with backoff, counted, so it cannot loop forever;
  - a broken digest template retries the rest of the batch the same way (slices already sent stay
    sent).
Only digest/runs.py writes digest_runs; the transitions are listed there.

The emergency stop (app/platform/mail_stop.py) holds within a second: no run is claimed while it is engaged,
and a batch at the provider checks it at least every SEND_CHECK_SECONDS and stops between two
mails; the runs not started go back to `pending` with no attempt counted.

Recording as the batch goes (Recorder): every RECORD_EVERY results or SEND_CHECK_SECONDS, the
outcomes so far are committed — each run with its events in one transaction, and only the events
this run read (digest/marks.py: the snapshot it read them as of), so an event that arrived meanwhile
waits for the next digest.

Crash safety: if the process dies after the provider accepted a mail but before its outcome was
committed, the run is still `processing`; the watchdog returns it to `pending` and the re-send
carries the same idempotency key (and Message-ID) — at most about RECORD_EVERY digests per worker
thread. A live process never sends twice because Postgres blinked: a flush that cannot be written
stops the batch (no further mail is started), the outcomes stay in the process until Postgres
answers again, and the claim on the runs is renewed meanwhile (app/platform/holds.py), so the
watchdog leaves them alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import cast

from app.platform import config, db, holds, mail_stop, metrics
from app.platform.providers import get_provider
from app.platform.providers.base import OutgoingMail, PermanentError, Progress, Provider, ProviderError, SendResult
from app.subscribers import budget
from digest import runs as digest_runs
from digest.build import Batch, build_slice, load_batch
from digest.claim import ClaimedRun, claim
from digest.group import Digest

log = logging.getLogger("digest.send")

# Outcomes committed at least every this many digests a thread has sent: what a SIGKILL can make it
# send twice. 20 and not 100 (a whole batch, as before): ~4 short transactions a batch instead of one
# (scripts/bench/digest.py measured the cost, docs/history.md).
RECORD_EVERY = 20


_RECORDED = ("sent", "skipped", "handled", "retry", "released", "failed")  # the lists record() writes


@dataclass
class Outcome:
    sent: list = field(default_factory=list)  # (run_id, event_ids, message_id, provider)
    skipped: list = field(default_factory=list)  # (run_id, reason)
    handled: list = field(default_factory=list)  # (run_id, event_ids) of skipped runs: own activity only
    covers: dict = field(default_factory=dict)  # run_id: (subscriber_id, Cover) of runs that move the mark
    budget: dict = field(default_factory=dict)  # run_id: (subscriber_id, local day) of runs the budget counted
    retry: list = field(default_factory=list)  # (run_id, error[, provider it is pinned to])
    released: list = field(default_factory=list)  # run_id: not started, all mail was stopped
    failed: list = field(default_factory=list)  # (run_id, error)
    lateness: list = field(default_factory=list)  # seconds from scheduled_for to sent, per sent run
    exhausted: int = 0  # retries that used the last attempt (now failed)
    skipped_seen: int = 0  # of `skipped`: everything in them was seen in the app already
    written: dict = field(default_factory=dict)  # list name: how many of its first items are recorded

    def unwritten(self) -> Outcome:
        """What is not recorded yet, as an Outcome of its own (record() writes one)."""
        part = Outcome(covers=self.covers, budget=self.budget)
        for name in _RECORDED:
            setattr(part, name, getattr(self, name)[self.written.get(name, 0) :])
        return part

    def wrote(self, part: Outcome) -> None:
        """`part` (from unwritten()) is committed."""
        for name in _RECORDED:
            self.written[name] = self.written.get(name, 0) + len(getattr(part, name))
        self.lateness += part.lateness
        self.exhausted += part.exhausted

    def all_written(self) -> bool:
        return all(self.written.get(name, 0) == len(getattr(self, name)) for name in _RECORDED)

    def counts(self) -> dict:
        counts = {
            "sent": len(self.sent),
            "skipped": len(self.skipped),
            "retry": len(self.retry),
            "failed": len(self.failed),
        }
        if self.released:  # only when the emergency stop cut a batch short
            counts["released"] = len(self.released)
        if self.skipped_seen:
            counts["skipped_seen"] = self.skipped_seen
        return counts


class Recorder:
    """A batch's outcomes, recorded as they come: Progress calls flush() on the batch's thread every
    RECORD_EVERY results or SEND_CHECK_SECONDS, which writes what arrived (one transaction: runs and
    their events together) and reads the emergency stop. A worker killed mid-batch so leaves at most
    about RECORD_EVERY accepted digests of a thread unrecorded (sent again, same Message-IDs).
    A flush that cannot be written raises, and the provider starts no further mail (Progress): the
    outcomes stay here until Postgres answers again (write_all)."""

    def __init__(self, conn, settings):
        self.conn, self.settings = conn, settings
        self.outcome = Outcome()
        self._chunk: list[ClaimedRun] = []  # the runs of the provider call under way, by position
        self._taken: set[int] = set()  # positions of that call already in `outcome`
        self._stop_checked = time.monotonic()

    def progress(self) -> Progress:
        return Progress(self.flush, every=RECORD_EVERY, interval=mail_stop.SEND_CHECK_SECONDS)

    def calling(self, chunk: list[ClaimedRun]) -> None:
        self._chunk, self._taken = chunk, set()

    def take(self, results) -> None:
        """[(position in the call, SendResult)], each position once."""
        outcome = self.outcome
        for i, result in results:
            if i in self._taken:
                continue
            self._taken.add(i)
            run = self._chunk[i]
            if result.stopped:
                outcome.released.append(run.id)
            elif result.ok:
                outcome.sent.append((run.id, cast(Digest, run.digest).event_ids, result.message_id, result.provider))
            elif result.permanent:
                outcome.failed.append((run.id, result.error or "permanent provider error"))
            else:
                # maybe accepted (ambiguous): the retry goes to that provider alone
                pin = result.provider if result.ambiguous else None
                outcome.retry.append((run.id, result.error or "transient provider error", pin))

    def flush(self, results) -> bool:
        self.take(results)
        self.write()
        if time.monotonic() - self._stop_checked < mail_stop.SEND_CHECK_SECONDS:
            return False  # a flush for the count: the emergency stop was read a moment ago
        self._stop_checked = time.monotonic()
        return mail_stop.engaged_on(self.conn)

    def write(self) -> None:
        """What is not recorded yet, in one transaction, once (raises when it cannot be written)."""
        part = self.outcome.unwritten()
        if part.all_written():  # nothing new
            return
        with db.transaction(self.conn) as cur:
            record(cur, part, self.settings)
        self.outcome.wrote(part)

    def write_all(self) -> None:
        """What the provider accepted is written once Postgres answers again, however long that
        takes — never thrown away and sent a second time: the runs stay `processing` and this
        process renews its claim on them meanwhile (app/platform/holds.py)."""
        if self.outcome.unwritten().all_written():
            return

        def reconnecting():
            self.conn = db.thread_connection.get()
            try:
                self.write()
            except db.UNAVAILABLE:
                db.thread_connection.reset()
                raise

        db.until_written(reconnecting, None, f"recording {len(self.outcome.sent)} sent digests")


def send(provider: Provider, ready: list[ClaimedRun], recorder: Recorder, progress: Progress) -> None:
    step = max(1, provider.max_batch)
    for start in range(0, len(ready), step):
        chunk = ready[start : start + step]
        recorder.calling(chunk)
        try:
            results = provider.send_batch([cast(OutgoingMail, r.mail) for r in chunk], progress)  # built: has one
        except ProviderError as exc:  # the whole call: every run of it not reported shares the outcome
            log.warning("provider %s failed for %d digest(s): %s", provider.name, len(chunk), exc)
            permanent = isinstance(exc, PermanentError)
            results = [SendResult(ok=False, error=str(exc), permanent=permanent)] * len(chunk)
        # Reported during the call but not flushed yet: this chunk's, so taken now, first (a reported
        # result wins; after an error, what was accepted before it is recorded as such). Left in the
        # Progress, the next call's flush would read them by its own chunk's positions.
        recorder.take(progress.drain())
        recorder.take(enumerate(results))


def record(cur, outcome: Outcome, settings=None) -> None:
    """ONE transaction (the caller commits): mark exactly the loaded events of every sent run, and
    move every run to its final or retry state."""
    settings = settings or config.get()
    outcome.lateness = digest_runs.mark_sent(cur, outcome.sent, outcome.covers)
    digest_runs.mark_events(cur, outcome.handled, outcome.covers)
    digest_runs.mark_skipped(cur, outcome.skipped)
    digest_runs.release(cur, outcome.released)
    _pending, failed = digest_runs.retry(
        cur, outcome.retry, settings.digest_max_attempts, settings.digest_retry_base_seconds
    )
    outcome.exhausted = failed
    if failed:
        log.warning("%d digest run(s) failed for good after %d attempts", failed, settings.digest_max_attempts)
    digest_runs.fail(cur, outcome.failed)
    if outcome.budget:  # a counted mail that did not go is given back (app/subscribers/budget.py)
        gone = {item[0] for item in (*outcome.skipped, *outcome.retry, *outcome.failed)} | set(outcome.released)
        budget.refund(cur, [outcome.budget[run_id] for run_id in gone if run_id in outcome.budget])


def process(run_ids: list[int] | None = None, limit: int | None = None, provider: Provider | None = None) -> dict:
    """Claim up to `limit` runs (the given ids, or any due), send their digests, record the outcome.
    Safe to call concurrently from any number of threads and processes."""
    settings = config.get()
    limit = limit or settings.digest_claim_batch
    if run_ids is not None:
        run_ids = [int(i) for i in run_ids]
        limit = max(limit, len(run_ids))
    started = time.monotonic()
    conn = db.thread_connection.get()  # this worker thread's, kept across batches
    claimed: list[ClaimedRun] = []
    try:
        with db.transaction(conn) as cur:
            claimed, skipped = claim(cur, run_ids, limit, settings.digest_max_attempts)
        timeout = settings.digest_processing_timeout_seconds
        with holds.hold("digest runs", [r.id for r in claimed], digest_runs.renew, timeout):
            recorder = Recorder(conn, settings)
            recorder.outcome.budget = {r.id: (r.subscriber_id, r.counted_on) for r in claimed if r.counted_on}
            _build_and_send(recorder, claimed, provider, settings)
            recorder.write_all()
        outcome = recorder.outcome
        counts = outcome.counts()
        counts["skipped"] += len(skipped)
        metrics.digest_batch(counts, outcome.exhausted, outcome.lateness)  # committed: counted once
        held = {r.id for r in claimed if r.held}
        if held:  # quiet hours over: what they held went out now (MAIL_HELD counted the hold)
            metrics.MAIL_RELEASED.inc(sum(1 for item in outcome.sent if item[0] in held))
        if claimed or skipped:
            log.info("digest batch: %s in %.0f ms", counts, (time.monotonic() - started) * 1e3)
        return counts
    except BaseException:
        db.thread_connection.reset()  # after any error it may be in an unknown state
        _release_after_crash([r.id for r in claimed], started)
        raise


def _build_and_send(recorder: Recorder, claimed: list[ClaimedRun], provider: Provider | None, settings) -> None:
    """Load the batch's events at once, then build and send it in slices of about
    DIGEST_BUILD_EVENTS loaded events: a worker thread holds one slice's digests, HTML and MIME, not
    the whole batch's. Eight threads each holding 100 large digests (75 events, 50 entities shown)
    made a worker's memory step up by ~20 MB per thread in the largest wave and keep it
    (docs/scaling.md); a batch of ordinary digests is still one slice."""
    outcome, conn = recorder.outcome, recorder.conn
    if not claimed:
        return
    try:
        with db.transaction(conn) as cur:
            batch = load_batch(cur, claimed, settings)
    except db.Error:
        raise
    except Exception as exc:
        log.exception("loading %d digests failed", len(claimed))
        outcome.retry.extend((r.id, f"build failed: {exc!r}") for r in claimed)
        return
    outcome.covers = {r.id: (r.subscriber_id, r.cover) for r in claimed if r.cover is not None}
    progress: Progress | None = None
    started = 0  # runs of the slices begun
    for part in batch.slices(claimed, settings.digest_build_events):
        if progress is not None:  # the emergency stop is checked between slices too, when due
            progress.poll()
            if progress.stop_requested():  # all mail stopped: the rest is not started
                outcome.released.extend(r.id for r in part)
                continue
        try:
            ready = _build(conn, part, batch, settings, outcome)
        except db.Error as exc:
            if progress is None:  # nothing handed to the provider yet: the batch fails as a whole
                raise
            # Earlier slices are at the provider: their outcome is recorded once Postgres answers
            # (never released and sent a second time); the runs not begun retry with backoff.
            log.warning("building a slice failed after %d digests were handed over: %s", len(outcome.sent), exc)
            outcome.retry.extend((r.id, f"build failed: {exc!r}") for r in claimed[started:])
            break
        started += len(part)
        if ready:
            provider = provider or get_provider()
            progress = progress or recorder.progress()
            send(provider, ready, recorder, progress)
        for run in part:  # what the record needs is in `outcome` now
            run.digest = run.mail = None


def _build(conn, part: list[ClaimedRun], batch: Batch, settings, outcome: Outcome) -> list[ClaimedRun]:
    """The slice's runs with a mail to send; the others' outcomes go into `outcome`."""
    try:
        with db.transaction(conn) as cur:  # end the read transaction: never hold one open across SMTP
            ready, errors = build_slice(cur, part, batch, settings)
    except db.Error:
        raise
    except Exception as exc:
        log.exception("building %d digests failed", len(part))
        outcome.retry.extend((r.id, f"build failed: {exc!r}") for r in part)
        return []
    for run in part:
        if run.digest is None:
            outcome.skipped.append((run.id, "no events"))
        elif run.digest.empty and run.digest.seen_events:  # all seen in the app: handled, not mailed
            outcome.skipped.append((run.id, "already seen"))
            outcome.handled.append((run.id, run.digest.event_ids))
            outcome.skipped_seen += 1
        elif run.digest.empty:  # only the subscriber's own activity: handled, never shown
            outcome.skipped.append((run.id, "only own activity"))
            outcome.handled.append((run.id, run.digest.event_ids))
    outcome.retry.extend(errors)
    return ready


def _release_after_crash(run_ids: list[int], started: float | None = None) -> None:
    """After an unexpected error: runs we claimed go back to pending (attempt counted, backoff)
    instead of waiting for the watchdog; those the provider may have accepted keep the same key on
    the retry. When the error was the database going away (a restart mid-batch), the release is
    retried until it answers again — the runs are back within moments of its return, not after
    DIGEST_PROCESSING_TIMEOUT_SECONDS — and given up only where the watchdog takes over."""
    if not run_ids:
        return
    settings = config.get()

    def release():
        with db.raw_cursor() as cur:
            return digest_runs.retry(
                cur,
                [(i, "worker error, released") for i in run_ids],
                settings.digest_max_attempts,
                settings.digest_retry_base_seconds,
            )

    deadline = db.write_deadline(
        time.monotonic() if started is None else started, settings.digest_processing_timeout_seconds
    )
    try:
        back, failed = db.until_written(release, deadline, f"releasing {len(run_ids)} claimed digest runs")
        metrics.digest_runs({"retry": back, "failed": failed})  # committed
    except Exception:
        log.exception("could not release %d claimed runs; the watchdog will", len(run_ids))
