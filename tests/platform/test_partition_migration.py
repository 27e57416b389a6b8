"""The online conversion (migrations 0521-0526, after the expand step 0520) of tables already
holding tens of thousands of rows while events, webhook events and clicks keep arriving through the
real write paths: no write fails, none is lost or stored twice, and re-sent keys stay duplicates
before, during and after the swap.
scripts/bench/partition_migration.py does the same with millions of rows and measures the waits."""

from __future__ import annotations

import shutil
import threading
import time

import psycopg2
import pytest

from app.platform import groupcommit, migrate, partitions
from digest import ingest
from scripts.bench.partition_migration import webhook_writer_of_that_release
from tests.batch_loop import BatchLoop
from tests.scratch import scratch_url  # noqa: F401 - fixture
from tracking import recorder

pytestmark = pytest.mark.not_pooled("a scratch database of its own, straight on Postgres, as migrations run")

SEEDED = 30_000
EXPAND = "0520"  # the key tables and their triggers: what this release's writers need


def seed(url: str) -> None:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
            "payload, received_at) SELECT 'producer', 'old-' || i, 'user-' || (i %% 500), 'likes', 'post', "
            "'p' || (i %% 97), '{\"title\": \"old\"}', now() - make_interval(mins => %s - i) "
            "FROM generate_series(1, %s) i",
            (SEEDED, SEEDED),
        )
        cur.execute(
            "INSERT INTO webhook_events (sg_event_id, event, email, payload, processed_at) "
            "SELECT 'old-' || i, 'open', 'a@example.test', '{}', now() FROM generate_series(1, 5000) i"
        )
        cur.execute(
            "INSERT INTO email_link_history (kind, mail_kind, mail_id, occurred_at) "
            "SELECT 'open', 'digest', i, now() FROM generate_series(1, 5000) i"
        )


class Traffic(BatchLoop):
    """Writers that keep going until stopped: event batches through validation and the ingest
    group-commit writer (what POST /v1/events does), webhook batches through the webhook store's
    writer, clicks through the history recorder. Every batch re-sends one key stored before the
    conversion and one stored by this run, so duplicates must come back as duplicates throughout."""

    def __init__(self, url: str):
        super().__init__()
        self.events = ingest.new_writer(url)
        self.webhooks = groupcommit.GroupCommitWriter("webhook-test", webhook_writer_of_that_release, url=url)
        self.history = recorder.HistoryRecorder(url)
        self.accepted, self.duplicates, self.resent = set(), 0, 0
        self.webhook_stored, self.webhook_duplicates = set(), 0
        self.clicks = 0

    def one_batch(self, n: int) -> None:
        new = [f"new-{n}-{i}" for i in range(20)]
        again = [f"old-{n % SEEDED + 1}"] + ([f"new-{n - 1}-0"] if n else [])
        body = {
            "events": [
                {
                    "id": i,
                    "user_id": f"user-{n % 500}",
                    "category": "likes",
                    "entity_type": "post",
                    "entity_id": "p1",
                    "payload": {"n": n},
                }
                for i in new + again
            ]
        }
        rows, errors = ingest.validate_body(body, "producer")
        assert not errors
        result = self.events.submit(rows, size=len(rows)).result(timeout=60)
        assert (result.accepted, result.duplicates) == (len(new), len(again)), (n, result)
        self.accepted.update(new)
        self.duplicates += result.duplicates
        self.resent += len(again)
        hooks = [(f"sg-new-{n}-{i}", "delivered", "a@example.test", "{}") for i in range(5)]
        hooks.append((f"old-{n % 5000 + 1}", "open", "a@example.test", "{}"))
        stored = self.webhooks.submit(sorted(hooks)).result(timeout=60)
        assert (stored.stored, stored.duplicates) == (5, 1), (n, stored)
        self.webhook_stored.update(h[0] for h in hooks[:5])
        for _ in range(5):  # the recorder's own line format, buffered, then written by COPY
            self.history.add(
                recorder.copy_line("open", None, "digest", n, None, "192.0.2.1", "test", False, None, time.time())
            )
        self.clicks += self.history.flush()


def migrate_until(url: str, last: str, folder) -> None:
    folder.mkdir()
    for m in migrate.discover():
        if m.version <= last:
            shutil.copy(m.path, folder / m.path.name)
    real_discover = migrate.discover
    migrate.discover = lambda directory=folder: real_discover(directory)
    try:
        migrate.migrate(url)
    finally:
        migrate.discover = real_discover


@pytest.mark.slow
def test_conversion_is_online_while_writes_go_on(scratch_url, tmp_path, monkeypatch, caplog):
    migrate_until(scratch_url, "0519", tmp_path / "before")  # the schema as it was before partitioning
    seed(scratch_url)
    migrate_until(scratch_url, EXPAND, tmp_path / "expand")

    traffic = Traffic(scratch_url)
    traffic.start()
    traffic.wait_batches(3)
    real_apply = {"tx": migrate._apply_transactional, "auto": migrate._apply_autocommit}
    holders = []

    def interleaved(kind):
        def apply(conn, m, *rest):
            traffic.wait_batches(2)  # writes committed between every two files
            if m.name == "partition_digest_events":
                # A query still reading the table makes the swap wait: it gives up after
                # MIGRATION_LOCK_TIMEOUT and retries instead of queueing the writers behind it.
                holder = psycopg2.connect(scratch_url)
                holder.cursor().execute("SELECT count(*) FROM digest_events")
                holders.append(holder)
                threading.Timer(1.0, holder.rollback).start()
            real_apply[kind](conn, m, *rest)

        return apply

    monkeypatch.setattr(migrate, "_apply_transactional", interleaved("tx"))
    monkeypatch.setattr(migrate, "_apply_autocommit", interleaved("auto"))
    with caplog.at_level("WARNING", logger="app.platform.migrate"):
        applied = migrate.migrate(scratch_url)
    traffic.wait_batches(5)
    traffic.stop()
    for holder in holders:
        holder.close()

    assert applied == [m.version for m in migrate.discover() if m.version > EXPAND]
    assert "partition_digest_events.sql: lock not granted" in caplog.text
    with psycopg2.connect(scratch_url) as conn, conn.cursor() as cur:
        for table in partitions.TABLES:
            assert partitions.is_partitioned(cur, table.name)
            assert partitions.list_partitions(cur, table.name)[0].name == f"{table.name}_legacy"
        cur.execute("SELECT producer_id FROM digest_events WHERE producer_id LIKE 'new-%%'")
        stored_new = [r[0] for r in cur.fetchall()]
        assert sorted(stored_new) == sorted(traffic.accepted)  # none lost, none twice
        cur.execute("SELECT count(*), count(DISTINCT (source, producer_id)) FROM digest_events")
        assert cur.fetchone() == (SEEDED + len(traffic.accepted),) * 2
        assert traffic.duplicates == traffic.resent
        cur.execute("SELECT count(*) FROM digest_events_legacy WHERE producer_id LIKE 'old-%%'")
        assert cur.fetchone() == (SEEDED,)
        # Every stored row owns exactly its key.
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE e.id = k.event_id) FROM digest_event_keys k "
            "LEFT JOIN digest_events e USING (source, producer_id)"
        )
        assert cur.fetchone() == (SEEDED + len(traffic.accepted),) * 2
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE e.id = k.event_id) FROM webhook_event_keys k "
            "LEFT JOIN webhook_events e USING (sg_event_id)"
        )
        assert cur.fetchone() == (5000 + len(traffic.webhook_stored),) * 2
        cur.execute("SELECT count(*) FROM webhook_events")
        assert cur.fetchone() == (5000 + len(traffic.webhook_stored),)
        cur.execute("SELECT count(*) FROM email_link_history")
        assert cur.fetchone() == (5000 + traffic.clicks,)
        # The claim no longer looks in the old unique index (gone): a key table probe per row.
        cur.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE '%%claim_key' AND prosrc LIKE '%%EXISTS%%'")
        assert cur.fetchone() == (0,)
        # Ids go on from the old sequences.
        cur.execute("SELECT max(id) FROM digest_events")
        assert cur.fetchone()[0] >= SEEDED + len(traffic.accepted)
