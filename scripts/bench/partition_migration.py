"""The online conversion of the event tables to monthly partitions (migrations 0520-0526) on
tables holding millions of rows, while events, webhook events and clicks keep arriving through the
service's own write paths. Prints how long each migration took and what the writers felt.

    .venv/bin/python scripts/bench/partition_migration.py [--rows 3000000] [--writers 4]

Steps: a fresh database at the schema before 0520; --rows digest_events (spread over the last
60 days, 90 % included in a digest), --rows/10 webhook_events and --rows/10 email_link_history;
VACUUM ANALYZE; 0520 (the key tables and triggers this release's writers need: milliseconds, as a
release applies it before starting the new processes). Then writer threads start: each sends
batches of 20 new events + 2 re-sent ones (one stored before the conversion, one by itself)
through validation and the ingest group-commit writer (what POST /v1/events does), 5 + 1 re-sent
webhook events through the webhook store's writer (as it was then: webhook_writer_of_that_release),
and 5 opens through the click-history recorder. After --warmup seconds, `migrate` runs every
migration after 0520 (0521-0526: the conversion) while they go on, and they go on for --after
seconds more.

Measured per phase (before / during / after the migration): batches/s and the commit wait of an
event batch (submit to committed: p50, p99, max); during the migration a sampler polls
pg_stat_activity every 10 ms for writers waiting on a lock and reports the longest wait seen; the
runner's lock-timeout retries are counted. At the end: every accepted event stored exactly once,
every re-send answered as a duplicate, and each key table holding exactly its rows' keys.
Database notify_bench_partition on postgresql://127.0.0.1, created and dropped here.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

from app.platform import config, groupcommit, migrate  # noqa: E402
from digest import ingest  # noqa: E402
from scripts.bench.shared import record  # noqa: E402
from tracking import recorder, webhook_intake  # noqa: E402

config.reload()
FIRST_NEW = "0520"
EXPAND = "0520"


def webhook_writer_of_that_release(cur, jobs: list[list[tuple]]) -> list[webhook_intake.StoreResult]:
    """webhook_intake.insert_jobs as it was when this conversion shipped: migration 0600 (after it)
    added canonical_email, which today's writer fills, to a webhook_events that does not have it yet
    here. The same INSERT and dedup (the key table's trigger skips a taken key)."""
    results = []
    for rows in jobs:
        stored = psycopg2.extras.execute_values(
            cur,
            "INSERT INTO webhook_events (sg_event_id, event, email, payload) VALUES %s RETURNING id",
            sorted(rows),
            template="(%s, %s, %s, %s::jsonb)",
            fetch=True,
        )
        results.append(webhook_intake.StoreResult(len(stored), len(rows) - len(stored), [r[0] for r in stored]))
    return results


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=3_000_000, help="digest_events rows before the conversion")
    p.add_argument("--writers", type=int, default=4, help="writer threads")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of writes before the migration")
    p.add_argument("--after", type=float, default=10.0, help="seconds of writes after it")
    p.add_argument("--database-url", default="postgresql://127.0.0.1/notify_bench_partition")
    return p.parse_args()


class _Retries(logging.Handler):
    """Counts the runner's 'lock not granted' warnings (one per lock timeout)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        if "lock not granted" in record.getMessage():
            self.count += 1


def recreate(url: str) -> None:
    base, name = url.rsplit("/", 1)
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()


def drop(url: str) -> None:
    base, name = url.rsplit("/", 1)
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def migrate_until(url: str, last: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for m in migrate.discover():
            if m.version <= last:
                shutil.copy(m.path, Path(tmp) / m.path.name)
        real = migrate.discover
        migrate.discover = lambda directory=Path(tmp): real(directory)
        try:
            migrate.migrate(url)
        finally:
            migrate.discover = real


def seed(url: str, rows: int) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO subscribers (user_id, email) SELECT 'user-' || i, 'user' || i || '@example.test' "
            "FROM generate_series(1, 5000) i"
        )
        cur.execute(
            "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status) "
            "SELECT id, 'daily', current_date - 1, now() - interval '1 day', 'sent' FROM subscribers"
        )
        cur.execute("SELECT min(id) FROM digest_runs")
        (run,) = cur.fetchone()
        step = 1_000_000
        for start in range(1, rows + 1, step):
            end = min(rows, start + step - 1)
            cur.execute(
                "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
                "actor_id, actor_name, payload, occurred_at, received_at, digest_run_id) "
                "SELECT 'producer', 'old-' || i, 'user-' || (i %% 5000), 'likes', 'post', 'p' || (i %% 997), "
                '\'a\' || (i %% 31), \'Actor\', \'{"title": "A post title", "url": "https://example.com/p"}\', '
                "now() - make_interval(secs => (%s - i) * 5184000.0 / %s), "
                "now() - make_interval(secs => (%s - i) * 5184000.0 / %s), "
                "CASE WHEN i %% 10 <> 0 THEN %s END FROM generate_series(%s, %s) i",
                (rows, rows, rows, rows, run, start, end),
            )
        n = max(1, rows // 10)
        cur.execute(
            "INSERT INTO webhook_events (sg_event_id, event, email, payload, received_at, processed_at) "
            "SELECT 'old-' || i, 'delivered', 'a@example.test', '{\"event\": \"delivered\"}', "
            "now() - make_interval(secs => (%s - i) * 51840.0), now() FROM generate_series(1, %s) i",
            (n, n),
        )
        cur.execute(
            "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, ip, user_agent, "
            "occurred_at) SELECT 'open', 'digest', i, i %% 5000, '192.0.2.1', 'Mozilla/5.0', "
            "now() - make_interval(secs => (%s - i) * 51840.0) FROM generate_series(1, %s) i",
            (n, n),
        )
        cur.execute("VACUUM ANALYZE")
    conn.close()


class Writers:
    """Writer threads over the service's own writers; each batch's commit wait is recorded with
    the phase it ended in."""

    def __init__(self, url: str, threads: int):
        self.events = ingest.new_writer(url)
        self.webhooks = groupcommit.GroupCommitWriter("bench-webhooks", webhook_writer_of_that_release, url=url)
        self.history = recorder.HistoryRecorder(url)
        self.phase = "before"
        self.waits: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        self.spans: dict[str, list[float]] = {}
        self.accepted = 0
        self.duplicates = self.resent = 0
        self.hooks_stored = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(threads)]

    def start(self):
        now = time.monotonic()
        self.spans["before"] = [now, now]
        for t in self._threads:
            t.start()

    def set_phase(self, phase: str) -> None:
        now = time.monotonic()
        self.spans.setdefault(self.phase, [now, now])[1] = now
        self.phase = phase
        self.spans[phase] = [now, now]

    def _run(self, w: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self._batch(w, n)
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            n += 1

    def _batch(self, w: int, n: int) -> None:
        new = [f"w{w}-{n}-{i}" for i in range(20)]
        again = [f"old-{(n * 7919 + w) % 1000 + 1}"] + ([f"w{w}-{n - 1}-0"] if n else [])
        body = {
            "events": [
                {
                    "id": i,
                    "user_id": f"user-{(n + w) % 5000}",
                    "category": "likes",
                    "entity_type": "post",
                    "entity_id": f"p{n % 97}",
                    "payload": {"title": "A post title"},
                }
                for i in new + again
            ]
        }
        rows, _errors = ingest.validate_body(body, "producer")
        started = time.monotonic()
        result = self.events.submit(rows, size=len(rows)).result(timeout=120)
        wait = time.monotonic() - started
        hooks = sorted(
            [(f"sg-w{w}-{n}-{i}", "delivered", "a@example.test", "{}") for i in range(5)]
            + [(f"old-{n % 1000 + 1}", "delivered", "a@example.test", "{}")]
        )
        stored = self.webhooks.submit(hooks, size=len(hooks)).result(timeout=120)
        for _ in range(5):
            self.history.add(
                recorder.copy_line("open", None, "digest", n, None, "192.0.2.1", "bench", False, None, time.time())
            )
        with self._lock:
            self.waits[self.phase].append(wait)
            self.accepted += result.accepted
            self.duplicates += result.duplicates
            self.resent += len(again)
            self.hooks_stored += stored.stored
            if result.accepted != len(new) or result.duplicates != len(again) or stored.stored != 5:
                self.errors.append(f"batch {w}/{n}: events {result}, webhooks {stored}")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)
        self.set_phase("done")
        self.history.flush()


class LockSampler:
    """Polls pg_stat_activity every 10 ms: the longest a writer was seen waiting on a lock."""

    def __init__(self, url: str):
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.longest = 0.0
        self.kinds: dict[str, int] = {}
        self.samples_waiting = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with self.conn.cursor() as cur:
            while not self._stop.is_set():
                cur.execute(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0), count(*), "
                    "coalesce(string_agg(DISTINCT wait_event, ','), '') "
                    "FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND (query LIKE 'INSERT INTO digest_events%%' OR query LIKE 'INSERT INTO webhook_events%%' "
                    "OR query LIKE '%%email_link_history%%') AND query NOT LIKE 'ALTER%%'"
                )
                longest, waiting, kinds = cur.fetchone()
                for kind in filter(None, kinds.split(",")):
                    self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self.samples += 1
                self.samples_waiting += bool(waiting)
                self.longest = max(self.longest, float(longest))
                time.sleep(0.01)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.conn.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    args = parse_args()
    url = args.database_url
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    retries = _Retries()
    logging.getLogger("app.platform.migrate").addHandler(retries)

    recreate(url)
    migrate_until(url, "0519")
    t0 = time.monotonic()
    seed(url, args.rows)
    print(
        f"seeded {args.rows:,} digest_events, {args.rows // 10:,} webhook_events and email_link_history "
        f"rows in {time.monotonic() - t0:.0f} s"
    )
    migrate_until(url, EXPAND)

    writers = Writers(url, args.writers)
    writers.start()
    time.sleep(args.warmup)
    sampler = LockSampler(url)
    sampler.start()
    writers.set_phase("during")
    started = time.monotonic()
    applied = migrate.migrate(url)
    took = time.monotonic() - started
    writers.set_phase("after")
    sampler.stop()
    time.sleep(args.after)
    writers.stop()

    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT version || '_' || name, duration_ms FROM schema_migrations WHERE version >= %s ORDER BY version",
            (FIRST_NEW,),
        )
        durations = cur.fetchall()
        cur.execute("SELECT count(*), count(DISTINCT (source, producer_id)) FROM digest_events")
        events, distinct = cur.fetchone()
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE e.id = k.event_id) FROM digest_event_keys k "
            "LEFT JOIN digest_events e USING (source, producer_id)"
        )
        keys, matching = cur.fetchone()
        cur.execute("SELECT count(*) FROM webhook_events")
        (hooks,) = cur.fetchone()
        cur.execute(
            "SELECT relname, pg_size_pretty(pg_total_relation_size(oid)) FROM pg_class "
            "WHERE relname IN ('digest_events_legacy', 'digest_event_keys')"
        )
        sizes = dict(cur.fetchall())
    conn.close()

    print(
        f"\nmigrations {', '.join(applied)} applied in {took:.1f} s with writes going on "
        f"({retries.count} lock-timeout retries):"
    )
    for name, ms in durations:
        note = "  (before the writers started)" if name.startswith(EXPAND) else ""
        print(f"  {name:<40} {ms / 1000:8.2f} s{note}")
    print(f"\nwriters ({args.writers} threads; one event batch = 20 new + 2 re-sent, then 6 webhook events, 5 opens):")
    print(f"  {'phase':<8} {'batches/s':>10} {'wait p50':>10} {'p99':>10} {'max':>10}")
    for phase in ("before", "during", "after"):
        waits = writers.waits[phase]
        span = writers.spans[phase][1] - writers.spans[phase][0]
        print(
            f"  {phase:<8} {len(waits) / max(span, 1e-9):10.0f} {pct(waits, 0.5) * 1000:8.1f}ms "
            f"{pct(waits, 0.99) * 1000:8.1f}ms {max(waits or [0]) * 1000:8.1f}ms"
        )
    print(
        f"  longest lock wait of a writer seen during the migration: {sampler.longest * 1000:.0f} ms "
        f"({sampler.samples_waiting} of {sampler.samples} samples had a writer waiting on a lock; "
        f"samples by lock type: {sampler.kinds})"
    )
    lost = args.rows + writers.accepted - events
    print(
        f"\nerrors {len(writers.errors)}  accepted {writers.accepted:,}  lost {lost}  "
        f"stored twice {events - distinct}  "
        f"re-sent {writers.resent:,} answered duplicate {writers.duplicates:,}  keys {keys:,} (owned by their row: "
        f"{matching:,})  webhook events {hooks:,}"
    )
    print(f"sizes: {sizes}")
    for e in writers.errors[:5]:
        print("  error:", e)
    ok = (
        not writers.errors
        and lost == 0
        and events == distinct
        and writers.duplicates == writers.resent
        and keys == matching == events
    )
    print("OK" if ok else "FAILED")
    bench = f"partition conversion, {args.rows:,} events, writes going on"
    during, before = writers.waits["during"], writers.waits["before"]
    record(
        bench,
        "writer commit wait p99 during the conversion",
        pct(during, 0.99) * 1000,
        "ms",
        baseline=pct(before, 0.99) * 1000,
        baseline_label="the same writers before it",
        higher_is_better=False,
        target="no write refused or lost; no writer stalled past MIGRATION_LOCK_TIMEOUT",
        met=ok and sampler.longest <= 0.25,
        longest_lock_wait_ms=round(sampler.longest * 1000),
        conversion_s=round(took, 1),
        errors=len(writers.errors),
        lost=lost,
    )
    drop(url)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
