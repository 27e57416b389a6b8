"""CREATE INDEX CONCURRENTLY on a partitioned table in a no-transaction migration
(app/platform/partitioned_index.py): built partition by partition while events keep arriving, and completed
by a rerun wherever a run stopped."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest

from app.platform import migrate, partitioned_index, partitions
from tests.batch_loop import BatchLoop
from tests.scratch import migrations_dir, released_on_first_lock_retry, scratch_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.not_pooled("a scratch database of its own, straight on Postgres, as migrations run")

NO_TX = "-- migrate: no-transaction\n"

# A small partitioned table, one of its partitions partitioned again (by hash).
READINGS = """
CREATE TABLE readings (id bigint NOT NULL, sensor text NOT NULL, taken_at timestamptz NOT NULL)
    PARTITION BY RANGE (taken_at);
CREATE TABLE readings_2025_01 PARTITION OF readings FOR VALUES FROM ('2025-01-01') TO ('2025-02-01');
CREATE TABLE readings_2025_02 PARTITION OF readings FOR VALUES FROM ('2025-02-01') TO ('2025-03-01')
    PARTITION BY HASH (id);
CREATE TABLE readings_2025_02_h0 PARTITION OF readings_2025_02 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE readings_2025_02_h1 PARTITION OF readings_2025_02 FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE readings_2025_03 PARTITION OF readings FOR VALUES FROM ('2025-03-01') TO ('2025-04-01');
INSERT INTO readings SELECT g, 's' || (g % 10), '2025-01-01'::timestamptz + make_interval(mins => g * 20)
    FROM generate_series(1, 6000) g;
"""
READINGS_INDEX = NO_TX + "CREATE INDEX CONCURRENTLY readings_sensor_idx ON readings (sensor) WHERE sensor <> 's0';\n"
_DEF = "USING btree (sensor) WHERE (sensor <> 's0'::text)"  # the parent's, as Postgres prints it
READINGS_STEPS = [  # what the runner executes for READINGS_INDEX, in order
    "CREATE INDEX readings_sensor_idx ON ONLY readings (sensor) WHERE sensor <> 's0'",
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS readings_2025_01_sensor_idx ON readings_2025_01 {_DEF}",
    "ALTER INDEX readings_sensor_idx ATTACH PARTITION readings_2025_01_sensor_idx",
    f"CREATE INDEX IF NOT EXISTS readings_2025_02_sensor_idx ON ONLY readings_2025_02 {_DEF}",
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS readings_2025_02_h0_sensor_idx ON readings_2025_02_h0 {_DEF}",
    "ALTER INDEX readings_2025_02_sensor_idx ATTACH PARTITION readings_2025_02_h0_sensor_idx",
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS readings_2025_02_h1_sensor_idx ON readings_2025_02_h1 {_DEF}",
    "ALTER INDEX readings_2025_02_sensor_idx ATTACH PARTITION readings_2025_02_h1_sensor_idx",
    "ALTER INDEX readings_sensor_idx ATTACH PARTITION readings_2025_02_sensor_idx",
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS readings_2025_03_sensor_idx ON readings_2025_03 {_DEF}",
    "ALTER INDEX readings_sensor_idx ATTACH PARTITION readings_2025_03_sensor_idx",
]


_RUN_STATEMENT = migrate._with_lock_retry


class Killed(BaseException):
    """The migrator dies between two statements (its connection goes with it)."""


def record_steps(monkeypatch, stop_after: int | None = None, before_each=None) -> list[str]:
    """Wrap the runner's statement execution: the statements run are listed; with `stop_after`
    the migrator is killed before the next one; `before_each` runs before every statement."""
    real = _RUN_STATEMENT
    done: list[str] = []

    def run(conn, statement):
        if stop_after is not None and len(done) >= stop_after:
            raise Killed(statement)
        if before_each:
            before_each()
        real(conn, statement)
        done.append(statement)

    monkeypatch.setattr(migrate, "_with_lock_retry", run)
    return done


def coverage(url: str, table: str, index: str) -> tuple[list[str], list[str], bool]:
    """(every partition at every level, the partitions holding a valid index in `index`'s tree,
    whether `index` itself is valid)."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT relid::regclass::text FROM pg_partition_tree(%s) WHERE level > 0 ORDER BY 1", (table,))
        parts = [r[0] for r in cur.fetchall()]
        cur.execute(
            "SELECT x.indrelid::regclass::text FROM pg_partition_tree(%s) t "
            "JOIN pg_index x ON x.indexrelid = t.relid WHERE t.level > 0 AND x.indisvalid ORDER BY 1",
            (index,),
        )
        indexed = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", (index,))
        valid = cur.fetchone()[0]
    conn.close()
    return parts, indexed, valid


def assert_complete(url: str, table: str, index: str) -> None:
    parts, indexed, valid = coverage(url, table, index)
    assert parts and indexed == parts and valid, (parts, indexed, valid)


def attached_oids(url: str, index: str) -> dict[str, int]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT relid::regclass::text, relid::oid FROM pg_partition_tree(%s) WHERE level > 0", (index,))
        found = dict(cur.fetchall())
    conn.close()
    return found


def pending(url: str) -> list[str]:
    return [r["version"] for r in migrate.status(url) if r["state"] == "pending"]


@pytest.fixture
def readings(scratch_url, migrations_dir):
    (migrations_dir / "0001_readings.sql").write_text(READINGS)
    assert migrate.migrate(scratch_url) == ["0001"]
    (migrations_dir / "0002_readings_sensor_idx.sql").write_text(READINGS_INDEX)
    return scratch_url


def test_an_index_on_a_partitioned_table_is_built_partition_by_partition(readings, monkeypatch):
    done = record_steps(monkeypatch)
    assert migrate.migrate(readings) == ["0002"]
    assert done == READINGS_STEPS
    assert_complete(readings, "readings", "readings_sensor_idx")
    with psycopg2.connect(readings) as conn, conn.cursor() as cur:  # the planner uses it
        cur.execute("SET enable_seqscan = off")
        cur.execute("EXPLAIN SELECT * FROM readings WHERE sensor = 's3'")
        plan = "\n".join(r[0] for r in cur.fetchall())
    conn.close()
    assert "readings_2025_01_sensor_idx" in plan and "readings_2025_02_h1_sensor_idx" in plan


@pytest.mark.parametrize("stop_after", range(len(READINGS_STEPS)))
def test_a_build_killed_after_any_step_is_completed_by_running_the_migration_again(readings, monkeypatch, stop_after):
    record_steps(monkeypatch, stop_after=stop_after)
    with pytest.raises(Killed):
        migrate.migrate(readings)
    assert pending(readings) == ["0002"]
    built_before = attached_oids(readings, "readings_sensor_idx") if stop_after else {}

    done = record_steps(monkeypatch)
    assert migrate.migrate(readings) == ["0002"]
    assert_complete(readings, "readings", "readings_sensor_idx")
    # Completed, not redone: what was attached before stays, and the steps done are not repeated
    # (an index built but not yet attached is only attached: its CREATE ... IF NOT EXISTS is a no-op).
    after = attached_oids(readings, "readings_sensor_idx")
    assert {name: after[name] for name in built_before} == built_before
    assert [s for s in done if "ATTACH" in s or "ON ONLY" in s] == [
        s for s in READINGS_STEPS[stop_after:] if "ATTACH" in s or "ON ONLY" in s
    ]


def test_a_partition_detached_before_it_got_its_index_leaves_the_index_valid_on_rerun(readings, monkeypatch):
    record_steps(monkeypatch, stop_after=len(READINGS_STEPS) - 2)  # every partition but the last done
    with pytest.raises(Killed):
        migrate.migrate(readings)
    with psycopg2.connect(readings) as conn, conn.cursor() as cur:
        cur.execute("ALTER TABLE readings DETACH PARTITION readings_2025_03")
    conn.close()
    record_steps(monkeypatch)
    assert migrate.migrate(readings) == ["0002"]
    assert_complete(readings, "readings", "readings_sensor_idx")


def rewrite_readings_index(url: str, migrations_dir, stop_after: int, monkeypatch) -> list[str]:
    """A build killed after `stop_after` steps; the operator drops the parent's index and writes
    another definition. Returns the names of the partition indexes the DROP left behind."""
    record_steps(monkeypatch, stop_after=stop_after)
    with pytest.raises(Killed):
        migrate.migrate(url)
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("DROP INDEX readings_sensor_idx")  # takes the attached partition indexes with it
        cur.execute("SELECT relname FROM pg_class WHERE relname LIKE 'readings%%sensor_idx' ORDER BY 1")
        left = [r[0] for r in cur.fetchall()]
    conn.close()
    (migrations_dir / "0002_readings_sensor_idx.sql").write_text(
        NO_TX + "CREATE INDEX CONCURRENTLY readings_sensor_idx ON readings (sensor, taken_at);"
    )
    return left


def assert_all_index(url: str, columns: str) -> None:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE pg_get_indexdef(x.indexrelid) LIKE %s), count(*) "
            "FROM pg_partition_tree('readings_sensor_idx') t JOIN pg_index x ON x.indexrelid = t.relid",
            (f"%({columns})",),
        )
        assert cur.fetchone() == (6, 6)  # the parent, readings_2025_02's and the four leaves'
    conn.close()


def test_a_partition_index_left_from_an_earlier_definition_is_dropped_and_built_anew(
    readings, migrations_dir, monkeypatch
):
    left = rewrite_readings_index(readings, migrations_dir, 2, monkeypatch)  # readings_2025_01's built, not attached
    assert left == ["readings_2025_01_sensor_idx"]
    done = record_steps(monkeypatch)
    assert migrate.migrate(readings) == ["0002"]
    assert "DROP INDEX CONCURRENTLY readings_2025_01_sensor_idx" in done
    assert_complete(readings, "readings", "readings_sensor_idx")
    assert_all_index(readings, "sensor, taken_at")


def test_a_partitioned_partition_index_left_from_an_earlier_definition_is_named_for_the_operator(
    readings, migrations_dir, monkeypatch
):
    left = rewrite_readings_index(readings, migrations_dir, 6, monkeypatch)  # half of readings_2025_02 done
    assert left == ["readings_2025_02_h0_sensor_idx", "readings_2025_02_sensor_idx"]
    record_steps(monkeypatch)
    with pytest.raises(partitioned_index.PartitionedIndexError, match="readings_2025_02_sensor_idx is left from"):
        migrate.migrate(readings)
    with psycopg2.connect(readings) as conn, conn.cursor() as cur:
        cur.execute("DROP INDEX readings_2025_02_sensor_idx")
    conn.close()
    assert migrate.migrate(readings) == ["0002"]
    assert_complete(readings, "readings", "readings_sensor_idx")
    assert_all_index(readings, "sensor, taken_at")


def test_a_unique_index_without_the_partition_key_is_refused_and_leaves_nothing(readings, migrations_dir):
    (migrations_dir / "0002_readings_sensor_idx.sql").unlink()
    (migrations_dir / "0003_readings_id.sql").write_text(
        NO_TX + "CREATE UNIQUE INDEX CONCURRENTLY readings_id_uq ON readings (id);"
    )
    with pytest.raises(psycopg2.errors.FeatureNotSupported, match="must include all partitioning columns"):
        migrate.migrate(readings)
    (migrations_dir / "0003_readings_id.sql").write_text(
        NO_TX + "CREATE UNIQUE INDEX CONCURRENTLY readings_id_uq ON readings (id, taken_at);"
    )
    assert migrate.migrate(readings) == ["0003"]
    assert_complete(readings, "readings", "readings_id_uq")
    with psycopg2.connect(readings) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT bool_and(x.indisunique) FROM pg_partition_tree('readings_id_uq') t "
            "JOIN pg_index x ON x.indexrelid = t.relid"
        )
        assert cur.fetchone() == (True,)
        with pytest.raises(psycopg2.errors.UniqueViolation):
            cur.execute("INSERT INTO readings VALUES (1, 'again', '2025-01-01 00:20+00')")
    conn.close()


def test_an_unnamed_index_on_a_partitioned_table_is_a_clear_error(readings, migrations_dir):
    (migrations_dir / "0002_readings_sensor_idx.sql").write_text(
        NO_TX + "CREATE INDEX CONCURRENTLY ON readings (sensor);"
    )
    with pytest.raises(partitioned_index.PartitionedIndexError, match="name the index"):
        migrate.migrate(readings)


@pytest.mark.parametrize(
    ("partition", "table", "index", "expected"),
    [
        (
            "digest_events_p2026_01",
            "digest_events",
            "digest_events_category_idx",
            "digest_events_p2026_01_category_idx",
        ),
        ("readings_2025_01", "readings", "by_sensor", "readings_2025_01_by_sensor"),
        (
            "email_link_history_p2026_01",
            "email_link_history",
            "email_link_history_mail_kind_mail_id_occurred_at_url_idx",
            "email_link_history_p2026_01_mail_kind_mail_id_occurred_c09daf06",
        ),
    ],
)
def test_a_partition_index_name_is_derived_from_the_parent_index_name(partition, table, index, expected):
    name = partitioned_index.child_index_name(partition, table, index)
    assert name == expected and len(name) <= 63
    assert partitioned_index.child_index_name(partition, table, index) == name  # the same on every run


# --- digest_events, the real schema --------------------------------------------------------------


@pytest.fixture
def events_db(scratch_url, migrations_dir):
    """A database with every real migration applied; the test's own migration files go beside them."""
    for m in migrate.discover(migrate.MIGRATIONS_DIR):
        shutil.copy(m.path, migrations_dir / m.path.name)
    migrate.migrate(scratch_url)
    return scratch_url


def month_partitions(url: str) -> list[partitions.Partition]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        found = partitions.list_partitions(cur, "digest_events")
    conn.close()
    return found


def add_months(url: str, days_ahead: int) -> list[str]:
    """What the scheduler does on every tick, as if `days_ahead` days had passed."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        return partitions.ensure_ahead(conn, now=datetime.now(UTC) + timedelta(days=days_ahead))
    finally:
        conn.close()


def invalid_indexes(url: str) -> list[str]:
    conn = psycopg2.connect(url)
    try:
        return migrate.invalid_indexes(conn)
    finally:
        conn.close()


def seed_every_partition(url: str, per_partition: int) -> None:
    """`per_partition` events in each partition (the old table's range starts at MINVALUE)."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        for n, part in enumerate(month_partitions(url)):
            start = part.range_from or part.range_to - timedelta(days=30)
            cur.execute(
                "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
                "received_at) SELECT 'seed', %s || '-' || i, 'user-' || (i %% 300), 'likes', 'post', "
                "'p' || i, %s + make_interval(secs => i) FROM generate_series(1, %s) i",
                (f"seed-{n}", start, per_partition),
            )
    conn.close()


class EventWriter(BatchLoop):
    """Inserts events into digest_events until stopped, BATCH per transaction spread over the old
    table and the month partitions, and counts what it committed. Its own lock_timeout is the bound
    a writer may wait: one that waits longer fails with LockNotAvailable, raised by stop()."""

    BATCH = 20

    def __init__(self, url: str, lock_timeout: str):
        super().__init__()
        self.conn = psycopg2.connect(url, options=f"-c lock_timeout={lock_timeout}")
        self.sent = 0
        self.slowest = 0.0

    def one_batch(self, n: int) -> None:
        started = time.monotonic()
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, "
                "entity_id, received_at) SELECT 'writer', %s || '-' || i, 'user-' || i, 'likes', "
                "'post', 'p1', now() + make_interval(days => 29 * (i %% 4)) "
                "FROM generate_series(1, %s) i",
                (f"w-{n}", self.BATCH),
            )
            assert cur.rowcount == self.BATCH
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.sent += self.BATCH

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.conn.close()


def test_an_index_on_digest_events_is_built_while_events_keep_arriving(
    events_db, migrations_dir, monkeypatch, settings, caplog
):
    """A writer inserts the whole time, and commits between every two steps of the build. A
    migrator statement that waits for a lock queues the writers behind it for at most
    MIGRATION_LOCK_TIMEOUT (here 200ms), then gives up and retries later; its hold, once granted,
    is a catalog change. The writer's own lock_timeout of 5 s turns a longer wait into a failure.
    A transaction still writing when the build starts makes the first step time out once."""
    settings(migration_lock_timeout="200ms", migration_retries=20)
    seed_every_partition(events_db, 3000)
    (migrations_dir / "0990_digest_events_indexes.sql").write_text(
        NO_TX
        + "-- plain, and unique (a unique index on a partitioned table must contain the partition key)\n"
        + "CREATE INDEX CONCURRENTLY digest_events_category_idx ON digest_events (category, entity_type, entity_id);\n"
        + "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS digest_events_producer_received_uq\n"
        + "    ON digest_events (source, producer_id, received_at);\n"
    )
    writer = EventWriter(events_db, lock_timeout="5s")
    writer.start()
    writer.wait_batches(3)
    steps = record_steps(monkeypatch, before_each=lambda: writer.wait_batches(2))
    holder = psycopg2.connect(events_db)
    holder.cursor().execute("LOCK TABLE digest_events IN ROW EXCLUSIVE MODE")  # what an open write holds
    batches_before = writer.batches
    with caplog.at_level("WARNING", logger="app.platform.migrate"), released_on_first_lock_retry(holder) as released:
        applied = migrate.migrate(events_db)
    batches_during = writer.batches - batches_before
    writer.wait_batches(3)
    writer.stop()  # raises if the writer waited beyond its bound
    holder.close()

    assert applied == ["0990"]
    assert released.fired and "lock not granted" in caplog.text
    months = month_partitions(events_db)
    steps = [s for s in steps if not s.startswith("DROP")]  # a build that timed out is dropped before its retry
    assert len(steps) == 2 * (1 + 2 * len(months))  # per index: the parent, then build + attach per partition
    assert batches_during >= 2 * len(steps)
    with psycopg2.connect(events_db) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM digest_events WHERE source = 'writer'")
        assert cur.fetchone() == (writer.sent,)  # every write landed
        cur.execute("SELECT count(*) FROM digest_events")
        assert cur.fetchone() == (writer.sent + 3000 * len(months),)
        cur.execute(
            "SELECT indisunique FROM pg_index WHERE indexrelid = 'digest_events_producer_received_uq'::regclass"
        )
        assert cur.fetchone() == (True,)
    conn.close()
    assert invalid_indexes(events_db) == []
    for index in ("digest_events_category_idx", "digest_events_producer_received_uq"):
        assert_complete(events_db, "digest_events", index)

    # Months added later (app/platform/partitions.py: created alone, then attached) get both indexes.
    assert add_months(events_db, days_ahead=200)
    for index in ("digest_events_category_idx", "digest_events_producer_received_uq"):
        assert_complete(events_db, "digest_events", index)
    print(
        f"\n{writer.batches} batches of {writer.BATCH} events ({batches_during} during the build of "
        f"{len(steps)} steps); slowest batch {writer.slowest * 1000:.0f} ms"
    )


def test_a_failed_partition_build_is_repaired_by_a_rerun_with_months_added_meanwhile(events_db, migrations_dir):
    """A unique build fails on one month's duplicate data: the months before it are attached, that
    month's index is INVALID, the parent's too. The scheduler adds months meanwhile; the operator
    fixes the data and the release runs again."""
    seed_every_partition(events_db, 200)
    months = month_partitions(events_db)
    broken = months[2]
    with psycopg2.connect(events_db) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
            "received_at) VALUES ('seed', 'dup-1', 'u', 'likes', 'post', 'same', %s), "
            "('seed', 'dup-2', 'u', 'likes', 'post', 'same', %s)",
            (broken.range_from, broken.range_from),
        )
    conn.close()
    (migrations_dir / "0990_digest_events_entity_uq.sql").write_text(
        NO_TX + "CREATE UNIQUE INDEX CONCURRENTLY digest_events_entity_uq ON digest_events (entity_id, received_at);"
    )
    with pytest.raises(psycopg2.errors.UniqueViolation):
        migrate.migrate(events_db)

    _, indexed, valid = coverage(events_db, "digest_events", "digest_events_entity_uq")
    assert not valid and indexed == sorted(p.name for p in months[:2])
    assert f"{broken.name}_entity_uq" in invalid_indexes(events_db)
    added = [name for name in add_months(events_db, days_ahead=200) if name.startswith("digest_events_")]
    _parts, indexed, valid = coverage(events_db, "digest_events", "digest_events_entity_uq")
    assert added and set(added) <= set(indexed) and not valid  # Postgres indexed the new months itself
    with psycopg2.connect(events_db) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM digest_events WHERE producer_id = 'dup-2'")  # the operator's fix
    conn.close()

    assert migrate.migrate(events_db) == ["0990"]
    assert_complete(events_db, "digest_events", "digest_events_entity_uq")
    assert invalid_indexes(events_db) == []
