"""Prometheus metrics: every metric object of the service is declared here, and the code where a
thing happens increments it with one line. README "Metrics" lists them.

Multiprocess mode: uvicorn workers and Dramatiq worker processes each write their values to
memory-mapped files in PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode), and
GET /metrics on any web process sums every process's files of its host (a host without a web
process runs `python -m app metrics-exporter`, app/web/health.py). The directory is chosen, exported and
created when this module is imported — before the first metric exists, which is when
prometheus-client picks its storage — so every process of a deployment (and the children it forks
or spawns) agrees on it. `setup()` (each process at start-up) removes the live-gauge files of
processes that are gone (`mark_process_dead`); `process_stopped()` does it for the process itself
at a clean exit. Counter and histogram files of dead processes stay, so totals never go backwards
while a deployment lives; empty the directory when a deployment starts from scratch.

prometheus-client creates a file before it writes its header, so a scrape can meet one empty while
another process starts, and a process killed in that moment leaves it so. A scrape leaves such a
file out and counts it (FilesCollector, notify_metrics_files_unreadable) instead of failing as a
whole; `setup()` removes those of processes that are gone.

Gauges read from Postgres and Redis (age of the oldest due digest, queue depths) are computed at
scrape time by StateCollector: one SQL statement under a short statement_timeout, and one LLEN per
queue. A failed read leaves those gauges out and sets notify_scrape_source_up to 0.
"""

from __future__ import annotations

import contextlib
import glob
import hmac
import logging
import os
import re
import threading
import time
from collections import Counter as Tally
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import GaugeMetricFamily

from app.platform import config, db, queue

log = logging.getLogger("app.platform.metrics")

ROOT = Path(__file__).resolve().parents[2]


def _directory() -> Path:
    raw = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or config.Settings.prometheus_multiproc_dir
    path = Path(raw)
    return path if path.is_absolute() else ROOT / path


DIRECTORY = _directory()
DIRECTORY.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(DIRECTORY)  # children (Dramatiq, uvicorn workers) inherit it
values.ValueClass = values.MultiProcessValue()  # also if a library imported prometheus_client first

CONTENT_TYPE = CONTENT_TYPE_LATEST
SCRAPE_STATEMENT_TIMEOUT_MS = 500
COUNT_CAP = 100_000  # the scrape-time counts stop here: a partial-index scan that stays cheap

# -- ingestion
EVENTS = Counter(
    "notify_events",
    "Events by result: accepted, duplicate (id already stored), rejected (in a 422 request)",
    ["result"],
)
# -- digests
DIGEST_RUNS = Counter(
    "notify_digest_runs",
    "Digest runs leaving a worker batch or taken back by the watchdog, "
    "by state: sent, skipped, retry (back to pending), failed",
    ["state"],
)
DIGEST_SKIPPED_SEEN = Counter(
    "notify_digest_skipped_seen",
    "Digest runs skipped because everything in them was seen in the app first (also counted skipped)",
)
DIGEST_LATENESS = Histogram(
    "notify_digest_lateness_seconds",
    "Seconds from a run's scheduled_for to its send",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
CRITICAL_EVENTS = Counter(
    "notify_critical_events",
    "Events stored with priority critical (sent at once, whatever quiet hours or budget), by category "
    "(a category not in the registry counts as `unregistered`)",
    ["category"],
)
MAIL_HELD = Counter(
    "notify_mail_held",
    "Mails that were due but wait, by reason: quiet_hours (the subscriber's window: they go when it ends), "
    "budget (the subscriber's mails of the day are spent: a newsletter waits for the next local day, an "
    "`immediately` subscriber's mail for its first minute)",
    ["reason"],
)
MAIL_RELEASED = Counter(
    "notify_mail_released",
    "Held mails that went out: digest runs held by quiet hours (held_at set), sent once the window ended",
)
# -- languages
I18N_FALLBACKS = Counter(
    "notify_i18n_fallbacks",
    "Messages a locale's own catalog lacked, by locale: the next locale of its chain was used",
    ["locale"],
)
# -- newsletters
NEWSLETTER_RECIPIENTS = Counter(
    "notify_newsletter_recipients",
    "Newsletter outbox rows by outcome of a send attempt: sent, retry, failed, suppressed",
    ["state"],
)
# -- providers
PROVIDER_CALLS = Counter(
    "notify_provider_calls",
    "Provider deliver calls by provider and result: ok, throttled, transient, permanent, ambiguous, unexpected",
    ["provider", "result"],
)
PROVIDER_LATENCY = Histogram(
    "notify_provider_call_seconds",
    "Provider deliver call latency",
    ["provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PROVIDER_AMBIGUOUS = Counter(
    "notify_provider_ambiguous",
    "Mails whose request went out with no answer (timeout, dropped connection, 504): maybe accepted, "
    "retried on the same provider only",
    ["provider"],
)
PROVIDER_BREAKER_STATE = Gauge(
    "notify_provider_breaker_state",
    "A provider's circuit breaker under MAIL_PROVIDERS failover: 0 closed, 1 half-open, 2 open "
    "(per process; the worst of the live processes)",
    ["provider"],
    multiprocess_mode="livemax",
)
PROVIDER_BREAKER_CHANGED = Gauge(
    "notify_provider_breaker_changed_at",
    "Unix time a provider's circuit breaker entered its current state (per process; the latest of the live ones)",
    ["provider"],
    multiprocess_mode="livemax",
)
PROVIDER_BREAKER_FAILURES = Gauge(
    "notify_provider_breaker_failures",
    "Definite failures a provider's breaker counted in the PROVIDER_BREAKER_WINDOW_SECONDS up to its last one "
    "(per process; summed over the live ones)",
    ["provider"],
    multiprocess_mode="livesum",
)
PROVIDER_BREAKER_FAILED_AT = Gauge(
    "notify_provider_breaker_failed_at",
    "Unix time of the last failure a provider's breaker counted (per process; the latest of the live ones)",
    ["provider"],
    multiprocess_mode="livemax",
)
PROVIDER_IN_FLIGHT = Gauge(
    "notify_provider_calls_in_flight", "Provider deliver calls under way", ["provider"], multiprocess_mode="livesum"
)
# -- tracking
WEBHOOK_EVENTS = Counter("notify_webhook_events", "Provider webhook events applied, by type", ["type"])
TRACKING_HITS = Counter(
    "notify_tracking_hits",
    "Clicks and opens by kind and by who: human or machine (as classified at request time)",
    ["kind", "who"],
)
# -- retention
RETENTION_NEVER_USED = Counter(
    "notify_retention_never_used",
    "Rows dropped by retention (RETENTION_DAYS) that were "
    "never used: digest_events never included in a digest, "
    "webhook_events never applied",
    ["table"],
)
RETENTION_PARTITIONS = Counter(
    "notify_retention_partitions_dropped", "Monthly partitions dropped by retention", ["table"]
)

# -- database
DB_POOL_WAIT = Histogram(
    "notify_db_pool_wait_seconds",
    "Time to check out a pooled Postgres connection (waiting for a free one, or opening a new one)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DB_POOL_TIMEOUTS = Counter(
    "notify_db_pool_timeouts",
    "Check-outs that gave up: all DB_POOL_SIZE connections stayed in use for DB_POOL_TIMEOUT_SECONDS",
)


def db_pool_checkout(seconds: float, timed_out: bool) -> None:
    DB_POOL_WAIT.observe(seconds)
    if timed_out:
        DB_POOL_TIMEOUTS.inc()


db.checkout_observers.append(db_pool_checkout)

# Bound once: a click or open pays only the increment (labels() costs as much again on the hot path).
_TRACKING_HIT = {
    (kind, machine): TRACKING_HITS.labels(kind, "machine" if machine else "human")
    for kind in ("click", "open")
    for machine in (False, True)
}


def tracking_hit(kind: str, machine: bool) -> None:
    _TRACKING_HIT[kind, machine].inc()


# Webhook event types are untrusted input: anything else is counted as `other`.
WEBHOOK_TYPES = frozenset(
    {
        "processed",
        "dropped",
        "delivered",
        "deferred",
        "bounce",
        "open",
        "click",
        "spamreport",
        "unsubscribe",
        "group_unsubscribe",
        "group_resubscribe",
    }
)
_NEWSLETTER_STATES = {"pending": "retry"}
_PID_FILE = re.compile(r"_(\d+)\.db$")


def count(metric: Counter, labels) -> None:
    """One increment per label value, e.g. the states of a batch's marks."""
    for label, n in Tally(labels).items():
        metric.labels(label).inc(n)


def newsletter_marks(marks) -> None:
    count(NEWSLETTER_RECIPIENTS, (_NEWSLETTER_STATES.get(m[1], m[1]) for m in marks))


def webhook_events(types) -> None:
    count(WEBHOOK_EVENTS, (t if t in WEBHOOK_TYPES else "other" for t in types))


def digest_runs(counts: dict) -> None:
    """Committed digest run transitions by state: a worker's batch, or runs taken back from a worker
    (the watchdog, a crashed batch's release: back to pending is `retry`, attempts used up `failed`)."""
    for state, n in counts.items():
        if n and state != "skipped_seen":  # a kind of skipped, counted on its own
            DIGEST_RUNS.labels(state).inc(n)
    if counts.get("skipped_seen"):
        DIGEST_SKIPPED_SEEN.inc(counts["skipped_seen"])


def digest_batch(counts: dict, exhausted: int, lateness: list[float]) -> None:
    """A committed digest batch: runs by state (retries that used their last attempt are failed)."""
    digest_runs({**counts, "retry": counts["retry"] - exhausted, "failed": counts["failed"] + exhausted})
    for seconds in lateness:
        DIGEST_LATENESS.observe(max(0.0, seconds))


def retention_never_used(table: str, n: int) -> None:
    """A detached partition's never-used rows, counted once before it is dropped (app/platform/retention.py)."""
    RETENTION_NEVER_USED.labels(table).inc(n)


def retention_dropped(table: str) -> None:
    RETENTION_PARTITIONS.labels(table).inc()


def provider_call(provider: str, result: str, started: float) -> None:
    """A deliver call ended (PROVIDER_IN_FLIGHT was raised before it)."""
    PROVIDER_LATENCY.labels(provider).observe(time.perf_counter() - started)
    PROVIDER_CALLS.labels(provider, result).inc()
    PROVIDER_IN_FLIGHT.labels(provider).dec()


# -- process lifecycle --------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def setup() -> None:
    """At a process's start-up: the directory exists, and live gauges of dead processes are gone, as
    are their files that cannot be read."""
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    files: dict[int, list[str]] = {}
    for name in os.listdir(DIRECTORY):
        if m := _PID_FILE.search(name):
            files.setdefault(int(m.group(1)), []).append(str(DIRECTORY / name))
    dead = [pid for pid in files if pid != os.getpid() and not _alive(pid)]
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(DIRECTORY))
    _remove_unreadable([path for pid in dead for path in files[pid]])


def _remove_unreadable(paths: list[str]) -> None:
    """Dead processes' files that cannot be read: nobody will complete one, and a new process given
    the same pid would fail on its first increment while opening it. One pass first, as a scrape
    reads them (the common case: all readable); one by one only when that fails."""
    try:
        _read_metrics(paths)
        return
    except Exception:
        pass
    for path in paths:
        try:
            _read(path)
        except Exception as exc:
            log.warning(
                "metrics: removed %s: its process is gone and it cannot be read (%s: %s)",
                path,
                exc.__class__.__name__,
                exc,
            )
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def process_stopped() -> None:
    """At a clean exit: this process's live gauges no longer count."""
    multiprocess.mark_process_dead(os.getpid(), str(DIRECTORY))


# -- scrape ---------------------------------------------------------------------------------------

_read_metrics = multiprocess.MultiProcessCollector._read_metrics  # the parsing its merge() does
_accumulate = multiprocess.MultiProcessCollector._accumulate_metrics  # the summing its merge() does


def _read(path: str) -> dict:
    """One file's metrics ({} when it is gone). Raises on a file that cannot be read."""
    try:
        return _read_metrics([path])
    except FileNotFoundError:  # removed since the listing: mark_process_dead, an operator
        return {}


_named: set[str] = set()  # files found unreadable and named in a WARNING, until they read again
_named_lock = threading.Lock()


def _left_out(path: str, exc: Exception) -> None:
    with _named_lock:
        if path in _named:
            return
        _named.add(path)
    log.warning(
        "metrics: %s left out of the scrape until it can be read (%s: %s); a process may be "
        "creating it, else it is broken",
        path,
        exc.__class__.__name__,
        exc,
    )


def _merge_into(merged: dict, part: dict) -> None:
    """One file's metrics added to the others', as _read_metrics adds them."""
    for name, metric in part.items():
        seen = merged.setdefault(name, metric)
        if seen is not metric:
            seen.samples += metric.samples
            if hasattr(metric, "_multiprocess_mode"):  # gauges: as the last file says
                seen._multiprocess_mode = metric._multiprocess_mode


class FilesCollector:
    """The values of every process of this host, summed: prometheus-client's MultiProcessCollector,
    except that a file that cannot be read (yet) is left out and counted instead of failing the
    scrape. The files are read in one pass, as MultiProcessCollector reads them (it parses each key
    once for all files); when that pass fails, one by one. A file found unreadable is read alone
    until it reads, so a leftover does not send every scrape down the slow path."""

    def collect(self):
        merged, unreadable = self.merged()
        yield from _accumulate(merged, accumulate=True)
        yield GaugeMetricFamily(
            "notify_metrics_files_unreadable",
            "Multiprocess metric files this scrape "
            "could not read and left out (a process creating one, or a broken file)",
            value=unreadable,
        )

    @staticmethod
    def merged() -> tuple[dict, int]:
        """(every readable file's metrics, per process as the files hold them; the files left out)."""
        paths = glob.glob(os.path.join(DIRECTORY, "*.db"))
        with _named_lock:
            _named.intersection_update(paths)  # forget files that are gone
            suspect = set(_named)  # one view: another scrape may add to _named meanwhile
        alone = [path for path in paths if path in suspect]
        try:
            merged = _read_metrics([path for path in paths if path not in suspect])
        except Exception:
            merged, alone = {}, paths
        unreadable = 0
        for path in alone:
            try:
                part = _read(path)
            except Exception as exc:
                unreadable += 1
                _left_out(path, exc)
                continue
            _named.discard(path)  # readable now: a later breakage is named again
            _merge_into(merged, part)
        return merged, unreadable


def _merged_files() -> dict:
    return FilesCollector.merged()[0]


@dataclass(frozen=True)
class BreakerReading:
    """One provider's circuit breaker as this host's live processes published it (failover.py)."""

    state: int  # the worst of the processes: 0 closed, 1 half-open, 2 open
    since: float | None  # unix time: when the first process still in that state entered it (closed: the last)
    failures: int  # failures counted in the window up to each process's last one, summed; 0 once that is old
    last_failure: float | None  # unix time of the last failure any process counted
    processes: int  # live processes that published it


_BREAKER_FAMILIES = {
    "notify_provider_breaker_state": "state",
    "notify_provider_breaker_changed_at": "since",
    "notify_provider_breaker_failures": "failures",
    "notify_provider_breaker_failed_at": "failed_at",
}


def breaker_readings(window: float, now: float | None = None) -> dict[str, BreakerReading]:
    """Every provider's breaker as the live processes of this host last published it — the one
    reader behind `notify providers` and the dashboard. Each process's values are read apart (the
    files keep them per process) and combined here: the worst state, since when (open or half-open:
    the earliest process to enter it; closed: the last process to close), and the failures counted
    within `window` seconds (PROVIDER_BREAKER_WINDOW_SECONDS) of now. A provider no live process has
    used is absent."""
    now = time.time() if now is None else now
    per: dict[str, dict[str, dict[str, float]]] = {}  # provider -> pid -> field -> value
    for name, metric in _merged_files().items():
        field_name = _BREAKER_FAMILIES.get(name)
        if field_name is None:
            continue
        for sample in metric.samples:
            labels = dict(sample.labels)  # as the files hold them: (name, value) pairs, the process's pid among them
            pid = labels.get("pid", "")
            if not pid.isdigit() or not _alive(int(pid)) or "provider" not in labels:
                continue
            per.setdefault(labels["provider"], {}).setdefault(pid, {})[field_name] = sample.value
    readings = {}
    for provider, processes in per.items():
        # A breaker publishes when it entered its state from the moment it exists: a process without
        # that time has no breaker for this provider (its values were reset, or never written).
        states = {pid: int(v.get("state", 0)) for pid, v in processes.items() if v.get("since")}
        if not states:
            continue
        worst = max(states.values())
        in_worst = [processes[pid] for pid, state in states.items() if state == worst]
        since_values = [v["since"] for v in in_worst if v.get("since")]
        failed_at = [v["failed_at"] for v in processes.values() if v.get("failed_at")]
        readings[provider] = BreakerReading(
            state=worst,
            since=(min(since_values) if worst else max(since_values)) if since_values else None,
            failures=int(
                sum(v.get("failures", 0) for v in processes.values() if now - v.get("failed_at", 0) <= window)
            ),
            last_failure=max(failed_at) if failed_at else None,
            processes=len(states),
        )
    return readings


# Recipients of the newsletters being sent, by email_log status, each read from its partial index
# (email_log_pending_idx, email_log_sending_idx, email_log_sent_idx — sent rows only since the
# earliest send request, index-only). failed, suppressed and cancelled have no index: counting them
# read the whole table for every scrape; notify_newsletter_recipients_total
# counts them as they happen.
NEWSLETTER_STATES = ("pending", "sending", "sent")
STATE_SQL = f"""
WITH nl AS MATERIALIZED (SELECT coalesce(array_agg(id), '{{}}') AS ids, min(send_requested_at) AS since
                         FROM newsletters WHERE status = 'sending')
SELECT (SELECT extract(epoch FROM now() - min(scheduled_for)) FROM digest_runs
        WHERE status = 'pending' AND scheduled_for <= now()),
       (SELECT count(*) FROM (SELECT 1 FROM digest_runs WHERE status = 'pending' AND scheduled_for <= now()
                              LIMIT {COUNT_CAP}) due),
       (SELECT count(*) FROM (SELECT 1 FROM digest_runs WHERE status = 'processing' LIMIT {COUNT_CAP}) busy),
       (SELECT count(*) FROM (SELECT 1 FROM webhook_events WHERE processed_at IS NULL LIMIT {COUNT_CAP}) hooks),
       (SELECT extract(epoch FROM min((SELECT max(range_to) FROM time_partitions(t::regclass))) - now())
        FROM unnest(ARRAY['digest_events', 'webhook_events', 'email_link_history']) t),
       (SELECT count(*) FROM (SELECT 1 FROM email_log, nl WHERE status = 'pending' AND newsletter_id = ANY (nl.ids)
                              LIMIT {COUNT_CAP}) pending),
       (SELECT count(*) FROM (SELECT 1 FROM email_log, nl WHERE status = 'sending' AND newsletter_id = ANY (nl.ids)
                              LIMIT {COUNT_CAP}) sending),
       (SELECT count(*) FROM (SELECT 1 FROM email_log, nl WHERE status = 'sent' AND sent_at >= nl.since
                                                          AND newsletter_id = ANY (nl.ids) LIMIT {COUNT_CAP}) sent),
       EXISTS (SELECT 1 FROM mail_stop)
"""


class StateCollector:
    """Gauges read at scrape time from Postgres (one statement) and Redis (LLEN per queue)."""

    def collect(self):
        up = GaugeMetricFamily(
            "notify_scrape_source_up", "Whether the scrape-time read of a source worked", labels=["source"]
        )
        try:
            with db.raw_cursor() as cur:
                cur.execute(f"SET LOCAL statement_timeout = {SCRAPE_STATEMENT_TIMEOUT_MS}")
                cur.execute(STATE_SQL)
                oldest, due, processing, unapplied, ahead, *recipients, stopped = cur.fetchone()
        except Exception as exc:
            log.warning("metrics: database read failed: %s", str(exc).strip().splitlines()[:1])
            up.add_metric(["postgres"], 0)
        else:
            up.add_metric(["postgres"], 1)
            yield GaugeMetricFamily(
                "notify_mail_stopped",
                "1 while the emergency stop holds all outgoing mail "
                "(python -m app stop-sending / resume-sending, or the dashboard)",
                value=int(stopped),
            )
            yield GaugeMetricFamily(
                "notify_digest_oldest_due_seconds",
                "Age of the oldest due, unsent digest run (0 when none is due)",
                value=float(oldest or 0),
            )
            yield GaugeMetricFamily(
                "notify_digest_runs_due", f"Pending digest runs already due (capped at {COUNT_CAP})", value=due
            )
            yield GaugeMetricFamily(
                "notify_digest_runs_processing", "Digest runs claimed by a worker", value=processing
            )
            yield GaugeMetricFamily(
                "notify_webhook_events_unapplied",
                f"Stored SendGrid events not applied yet (capped at {COUNT_CAP})",
                value=unapplied,
            )
            yield GaugeMetricFamily(
                "notify_partitions_ahead_seconds",
                "How far ahead the monthly partitions of the "
                "event tables reach (the least of the three): a row past it is refused. The "
                "scheduler keeps it above two months",
                value=float(ahead or 0),
            )
            family = GaugeMetricFamily(
                "notify_newsletter_sending_recipients",
                f"Outbox rows of the newsletters being sent, by status (capped at {COUNT_CAP})",
                labels=["state"],
            )
            for state, n in zip(NEWSLETTER_STATES, recipients):
                family.add_metric([state], n)
            yield family
        try:
            depths = {name: queue.depth(name) for name in queue.QUEUES}
        except Exception as exc:
            log.warning("metrics: redis read failed: %s", exc)
            up.add_metric(["redis"], 0)
        else:
            up.add_metric(["redis"], 1)
            family = GaugeMetricFamily(
                "notify_queue_depth", "Messages waiting in a Dramatiq queue (ready + delayed)", labels=["queue"]
            )
            for name, depth in depths.items():
                family.add_metric([name], depth)
            yield family
        yield up


def scrape() -> bytes:
    """The exposition text: every process's values summed, plus the scrape-time gauges. Blocking."""
    registry = CollectorRegistry()
    registry.register(FilesCollector())
    registry.register(StateCollector())
    return generate_latest(registry)


def token_matches(presented: str) -> bool:
    """METRICS_TOKEN, compared in constant time; never matches while it is unset."""
    expected = config.get().metrics_token
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())
