"""Fixtures: a real Postgres database and a real Redis db, cleaned between tests.

TEST_DATABASE_URL / TEST_REDIS_URL choose them (defaults: local notify_test, redis db 15), so
parallel checkouts can each use their own.

The PgBouncer pass (`make test`, scripts/dev/pgbouncer.py) points TEST_DATABASE_URL at a
transaction-pooling PgBouncer and TEST_DIRECT_DATABASE_URL at Postgres itself: migrations use the
direct one (what MIGRATION_DATABASE_URL is for in production), and tests marked `direct_db` (they
tell connections apart by backend pid) are skipped in that pass, with their reason.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

os.environ["APP_ENV"] = "test"
# A checkout's .env (written by `make run`: development settings, demo keys) is no part of a test run.
os.environ["ENV_FILE"] = ""
os.environ["DATABASE_URL"] = os.environ.get("TEST_DATABASE_URL", "postgresql://localhost/notify_test")
os.environ["REDIS_URL"] = os.environ.get("TEST_REDIS_URL", "redis://localhost:6379/15")
THROUGH_PGBOUNCER = os.environ.get("TEST_THROUGH_PGBOUNCER") == "1"
DIRECT_DATABASE_URL = os.environ.get("TEST_DIRECT_DATABASE_URL") or os.environ["DATABASE_URL"]
os.environ.setdefault("API_KEY_CACHE_SECONDS", "0")
os.environ.setdefault("MAIL_PROVIDER", "file")
# Prometheus values of this run (app/platform/metrics.py): its own directory, not the checkout's .var/metrics,
# removed when the run ends.
if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="notify-test-metrics-")
    atexit.register(shutil.rmtree, os.environ["PROMETHEUS_MULTIPROC_DIR"], True)

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
    migrate.migrate(DIRECT_DATABASE_URL)  # as MIGRATION_DATABASE_URL would in production
    db.init(database_url)
    yield


def pytest_collection_modifyitems(config, items):
    if not THROUGH_PGBOUNCER:
        return
    for item in items:
        marker = item.get_closest_marker("direct_db")
        if marker:
            why = marker.args[0] if marker.args else "needs a direct Postgres connection"
            item.add_marker(pytest.mark.skip(reason=f"PgBouncer pass: {why}"))


# Tables with rows, and tables whose id sequence moved (rows inserted, maybe deleted again).
_DIRTY_SQL = " UNION ".join(
    [f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t})" for t in db.ALL_TABLES]
    + [
        "SELECT split_part(sequencename, '_id_seq', 1) FROM pg_sequences "
        "WHERE schemaname = 'public' AND last_value IS NOT NULL"
    ]
)


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
    test touched are truncated: about 13 ms per test instead of 64 ms for all of them. Modules
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
            cur.execute("TRUNCATE " + ", ".join(dirty) + " RESTART IDENTITY CASCADE")
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
