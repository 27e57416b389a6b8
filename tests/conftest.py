"""Fixtures: a real Postgres database and a real Redis db, cleaned between tests.

TEST_DATABASE_URL / TEST_REDIS_URL choose them (defaults: local notify_test, redis db 15), so
parallel checkouts can each use their own.

The PgBouncer pass (`make test`, scripts/dev/pgbouncer.py) points TEST_DATABASE_URL at a
transaction-pooling PgBouncer and TEST_DIRECT_DATABASE_URL at Postgres itself: migrations use the
direct one (what MIGRATION_DATABASE_URL is for in production), and tests marked `direct_db` (they
tell connections apart by backend pid) are skipped in that pass, with their reason.

Under pytest-xdist (`-n N`) each worker gwK gets its own database and Redis db, derived from the
base URLs: database `<name>_gwK` (notify_test_gw0, notify_test_gw1, ...), a copy made with CREATE
DATABASE ... TEMPLATE of `<name>_template`, which the first worker migrates (the others find it up
to date); Redis db `<base> - K` (15, 14, 13, ... for the default db 15: TEST_REDIS_URL's db must be
at least N - 1, or N under `make test`, which runs the fuzz module beside them as gwN:
scripts/dev/beside.py). Each worker has its own Prometheus directory and mail folder (MAIL_FILE_DIR) too.
docs/testing.md says more.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import time
from urllib.parse import urlsplit, urlunsplit

# "gw0", "gw1", ... in a pytest-xdist worker (set before this file is imported); "" otherwise.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def worker_database_url(url: str, suffix: str) -> str:
    """The same server, database `<name>_<suffix>`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}_{suffix}"))


def worker_redis_url(url: str, worker: str) -> str:
    """Redis db `<base> - K` for worker gwK: counting down keeps clear of db 0, the development default."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    number = base - int(worker.removeprefix("gw"))
    if number < 0:
        raise RuntimeError(f"TEST_REDIS_URL db {base} leaves no Redis db for xdist worker {worker}: use a higher db")
    return urlunsplit(parts._replace(path=f"/{number}"))


os.environ["APP_ENV"] = "test"
# A checkout's .env (written by `make run`: development settings, demo keys) is no part of a test run.
os.environ["ENV_FILE"] = ""
BASE_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://localhost/notify_test")
BASE_DIRECT_DATABASE_URL = os.environ.get("TEST_DIRECT_DATABASE_URL") or BASE_DATABASE_URL
BASE_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://localhost:6379/15")
if WORKER:
    os.environ["DATABASE_URL"] = worker_database_url(BASE_DATABASE_URL, WORKER)
    DIRECT_DATABASE_URL = worker_database_url(BASE_DIRECT_DATABASE_URL, WORKER)
    os.environ["REDIS_URL"] = worker_redis_url(BASE_REDIS_URL, WORKER)
else:
    os.environ["DATABASE_URL"] = BASE_DATABASE_URL
    DIRECT_DATABASE_URL = BASE_DIRECT_DATABASE_URL
    os.environ["REDIS_URL"] = BASE_REDIS_URL
THROUGH_PGBOUNCER = os.environ.get("TEST_THROUGH_PGBOUNCER") == "1"
os.environ.setdefault("API_KEY_CACHE_SECONDS", "0")
os.environ.setdefault("MAIL_PROVIDER", "file")
# Prometheus values of this run (app/platform/metrics.py): its own directory, not the checkout's .var/metrics,
# removed when the run ends. An xdist worker inherits the controller's environment, so it makes its own.
if WORKER or "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="notify-test-metrics-")
    atexit.register(shutil.rmtree, os.environ["PROMETHEUS_MULTIPROC_DIR"], True)
# The file provider names a mail after its idempotency key, and every worker's ids start at 1: two
# workers writing the same name into one folder would race on its .tmp file.
if WORKER:
    os.environ["MAIL_FILE_DIR"] = tempfile.mkdtemp(prefix=f"notify-test-mail-{WORKER}-")
    atexit.register(shutil.rmtree, os.environ["MAIL_FILE_DIR"], True)

# Where the xdist workers of this run find the locks that let an `alone` test have the machine to
# itself: made by the controller (workers inherit its environment), removed when it ends.
if not WORKER and "NOTIFY_TEST_LOCK_DIR" not in os.environ:
    os.environ["NOTIFY_TEST_LOCK_DIR"] = tempfile.mkdtemp(prefix="notify-test-locks-")
    atexit.register(shutil.rmtree, os.environ["NOTIFY_TEST_LOCK_DIR"], True)

import pytest  # noqa: E402
import redis as redis_lib  # noqa: E402

from app.platform import apikeys, config, db, migrate  # noqa: E402
from app.subscribers import categories  # noqa: E402

config.reload()


@pytest.fixture(scope="session")
def database_url() -> str:
    return config.get().database_url


@pytest.fixture(scope="session")
def direct_database_url() -> str:
    """Postgres itself, even in the PgBouncer pass (what MIGRATION_DATABASE_URL points at)."""
    return DIRECT_DATABASE_URL


@pytest.fixture(scope="session")
def schema(database_url):
    if WORKER:
        _copy_template()
    else:
        migrate.migrate(DIRECT_DATABASE_URL)  # as MIGRATION_DATABASE_URL would in production
    _commit_without_waiting_for_disk(DIRECT_DATABASE_URL)
    db.init(database_url)
    yield


def _commit_without_waiting_for_disk(url: str) -> None:
    """synchronous_commit = off for the test database's sessions: a commit is visible to every other
    session at once, as always, but does not wait for its WAL flush. Only a crash of Postgres itself
    could tell the difference, and no test crashes the shared Postgres (the drills bring their own)."""
    conn = db.connect_raw(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{db.database_name(url)}" SET synchronous_commit = off')
    finally:
        conn.close()


# Serialises the xdist workers' template step (advisory locks are per database: taken in `postgres`).
_TEMPLATE_LOCK = 0x6E74_7470


def _copy_template() -> None:
    """This worker's database, a fresh copy of the migrated template. The lock keeps every other
    session off the template while it is copied (CREATE DATABASE refuses a template in use), and
    lets one worker migrate it while the others wait and then find nothing pending."""
    template = worker_database_url(BASE_DIRECT_DATABASE_URL, "template")
    mine = db.database_name(DIRECT_DATABASE_URL)
    admin = db.connect_raw(DIRECT_DATABASE_URL.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
            try:
                migrate.migrate(template)
                cur.execute(f'DROP DATABASE IF EXISTS "{mine}" WITH (FORCE)')
                cur.execute(f'CREATE DATABASE "{mine}" TEMPLATE "{db.database_name(template)}"')
            finally:
                cur.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
    finally:
        admin.close()


# Not even collected in the PgBouncer pass, which leaves out its `varies_input` tests anyway:
# schemathesis builds every operation's coverage cases while collecting (about 25 s of CPU on 2
# cores, in every xdist worker). Its lazy loader (schemathesis.pytest.from_fixture), which would
# defer that to the one worker running it, fails under pytest 9 (schemathesis 4.32: Function._nodeid).
collect_ignore = ["web/test_api_fuzz.py"] if THROUGH_PGBOUNCER else []


def pytest_collection_modifyitems(config, items):
    if WORKER:
        # The longest tests first (a stable sort keeps the order within each group): started last, a
        # drill would be the run's tail, with every other worker idle (docs/testing.md).
        items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("browser")))
    if not THROUGH_PGBOUNCER:
        return
    for item in items:
        marker = item.get_closest_marker("direct_db")
        if marker:
            why = marker.args[0] if marker.args else "needs a direct Postgres connection"
            item.add_marker(pytest.mark.skip(reason=f"PgBouncer pass: {why}"))
        marker = item.get_closest_marker("not_pooled")
        if marker:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"PgBouncer pass: not through the pool ({marker.args[0]}); the direct pass ran it"
                )
            )


# Tables with rows, and tables whose id sequence moved (rows inserted, maybe deleted again).
_DIRTY_SQL = " UNION ".join(
    [f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t})" for t in db.ALL_TABLES]
    + [
        "SELECT split_part(sequencename, '_id_seq', 1) FROM pg_sequences "
        "WHERE schemaname = 'public' AND last_value IS NOT NULL"
    ]
)
# The sequences each table owns (serial and identity columns) and where they start.
_OWNED_SEQUENCES_SQL = """
SELECT t.relname, s.oid::regclass::text, q.seqstart
FROM pg_class s
JOIN pg_sequence q ON q.seqrelid = s.oid
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid
    AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
JOIN pg_class t ON t.oid = d.refobjid
WHERE t.relnamespace = 'public'::regnamespace
"""


class _Emptier:
    """Empties the tables a test wrote. DELETE with triggers and foreign keys off (session_replication_role,
    superusers only) plus setval of the owned sequences leaves what TRUNCATE ... RESTART IDENTITY CASCADE
    leaves, without TRUNCATE's new files per table and their fsync: docs/history.md has the figures.
    Without the right to skip triggers, TRUNCATE."""

    def __init__(self, cur):
        cur.execute(_OWNED_SEQUENCES_SQL)
        self.sequences: dict[str, list[tuple[str, int]]] = {}
        for table, sequence, start in cur.fetchall():
            self.sequences.setdefault(table, []).append((sequence, start))
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        self.may_skip_triggers = bool(cur.fetchone()[0])

    def empty(self, cur, tables: list[str]) -> None:
        if not self.may_skip_triggers:
            cur.execute("TRUNCATE " + ", ".join(tables) + " RESTART IDENTITY CASCADE")
            return
        statements = ["SET LOCAL session_replication_role = replica"]
        statements += [f"DELETE FROM {t}" for t in tables]
        statements += [
            f"SELECT setval('{sequence}', {start}, false)"
            for t in tables
            for sequence, start in self.sequences.get(t, [])
        ]
        cur.execute("; ".join(statements))


_emptier: _Emptier | None = None


_locks: tuple[int, int] | None = None


@pytest.fixture(autouse=True)
def machine_to_itself(request):
    """Under xdist, a test marked `alone` runs while no other test does; the others share the machine.
    Readers-writer with a turnstile (flock): every test passes the turnstile before taking the shared
    lock, and an `alone` test holds the turnstile while it waits for and holds the exclusive one, so
    the other workers stop at the turnstile after their current test instead of starving it."""
    if not WORKER:
        yield
        return
    global _locks
    if _locks is None:
        folder = os.environ["NOTIFY_TEST_LOCK_DIR"]
        _locks = tuple(os.open(os.path.join(folder, name), os.O_CREAT | os.O_RDWR) for name in ("turnstile", "machine"))
    turnstile, machine = _locks
    alone = request.node.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(machine, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def process_not_stopping():
    """An in-process Dramatiq worker's stop() sets app.platform.shutdown.requested (the SIGTERM path), which
    would make every later send loop in this test process stop after one batch."""
    from app.platform import shutdown

    shutdown.requested.clear()
    yield
    shutdown.requested.clear()


@pytest.fixture(autouse=True)
def clean_db(request):
    """Every test starts from empty tables and ids from 1 (actors and writer threads commit on
    their own connections, so a per-test rollback cannot isolate them). Only the tables the last
    test wrote are emptied (_Emptier; docs/history.md compares the ways to do it). Modules
    marked `pure` (grouping, ranking, rendering, codes, templates) never touch the database:
    `make test-pure` runs them with Postgres and Redis unreachable."""
    if request.node.get_closest_marker("pure"):
        yield
        return
    request.getfixturevalue("schema")
    with db.raw_cursor() as cur:
        cur.execute(_DIRTY_SQL)
        dirty = sorted({row[0] for row in cur.fetchall()} & set(db.ALL_TABLES))
        if dirty:
            global _emptier
            if _emptier is None:
                _emptier = _Emptier(cur)
            _emptier.empty(cur, dirty)
    apikeys.cache.clear()
    categories.cache.clear()
    yield


@pytest.fixture
def redis_client():
    client = redis_lib.Redis.from_url(config.get().redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings():
    """Override settings for one test: settings(digest_max_items=3)."""
    saved = []

    def apply(**changes):
        saved.append(config.override(**changes))
        return config.get()

    yield apply
    if saved:
        config.restore(saved[0])


@pytest.fixture
def client():
    from starlette.testclient import TestClient

    from app.web import app

    with TestClient(app) as c:
        yield c


@pytest.fixture
def admin_key() -> str:
    return apikeys.create("admin-test", "admin")


@pytest.fixture
def events_key() -> str:
    return apikeys.create("producer-test", "events")


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    """Bounded polling for something another thread or process does (not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fake(redis_client):
    """A real local fake SendGrid (the shared rate limit lives in the test's clean Redis db)."""
    from tests.fake_sendgrid import FakeSendGrid

    with FakeSendGrid() as server:
        yield server


@pytest.fixture
def provider(fake):
    from app.platform.providers.sendgrid import SendGridProvider

    p = SendGridProvider(api_key="test-key", api_url=fake.url)
    yield p
    p.close()


@pytest.fixture
def live_server():
    """The real app under uvicorn on a free 127.0.0.1 port, in a thread; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    from app.web import app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("live server did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
