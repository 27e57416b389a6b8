"""The database layer (app/platform/db.py): one pool, one transaction helper, one kept connection per
worker thread — and connections are reused, never opened per unit of work or per message."""

from __future__ import annotations

import contextlib
import threading

import orjson
import psycopg2
import pytest

from app.platform import db
from tests.conftest import wait_for
from tests.tcp_proxy import TcpProxy
from tracking import links, webhook_apply


def on_new_thread(work):
    """work() on a fresh thread, as a worker thread would run it (no connection kept yet)."""
    result: dict = {}

    def run():
        try:
            result["value"] = work()
        except BaseException as exc:
            result["error"] = exc
        finally:
            db.thread_connection.reset()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if "error" in result:
        raise result["error"]
    return result["value"]


# Through PgBouncer a backend pid names the server connection a transaction happened to get, not
# the client connection these tests are about.
BY_PID = pytest.mark.direct_db(
    "tells connections apart by backend pid, which behind PgBouncer is the pooled "
    "server connection, not the application's"
)


def pid(cur) -> int:
    cur.execute("SELECT pg_backend_pid()")
    return cur.fetchone()[0]


def store_events(n: int) -> list[int]:
    rows = db.query(
        "INSERT INTO webhook_events (sg_event_id, event, email, payload) "
        "SELECT 'sg-' || i, 'delivered', 'a@example.com', %s::jsonb FROM generate_series(1, %s) i "
        "RETURNING id",
        (orjson.dumps({"event": "delivered"}).decode(), n),
    )
    return sorted(r[0] for r in rows)


def terminate(backend_pid: int) -> None:
    with contextlib.closing(db.connect_raw(autocommit=True)) as admin, admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
    wait_for(
        lambda: not db.query("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend_pid,)), 10, "the backend to end"
    )


# -- reuse ----------------------------------------------------------------------------------------


@BY_PID
def test_raw_cursor_units_on_one_thread_reuse_one_pooled_connection():
    def work():
        opened = db.connections_opened(this_thread=True)
        pids = set()
        for _ in range(50):
            with db.raw_cursor() as cur:
                pids.add(pid(cur))
        return pids, db.connections_opened(this_thread=True) - opened

    pids, opened = on_new_thread(work)
    assert len(pids) == 1
    assert opened <= 1  # at most one, when the pool had no idle connection to lend


@BY_PID
def test_webhook_apply_keeps_one_connection_across_messages():
    ids = store_events(40)

    def work():
        opened = db.connections_opened(this_thread=True)
        pids = set()
        for i in ids:  # one message per event, as the actor gets them
            assert webhook_apply.apply_events([i]) == 1
            with db.thread_connection.get().cursor() as cur:
                pids.add(pid(cur))
        return pids, db.connections_opened(this_thread=True) - opened

    # Counted per thread (db.connections_opened), not as backends of the database: other tests'
    # connections closing or lingering moved that count both ways.
    pids, opened = on_new_thread(work)
    assert len(pids) == 1
    assert opened == 1  # the worker thread's one kept connection
    assert db.query("SELECT count(*) FROM webhook_events WHERE processed_at IS NULL")[0][0] == 0


@BY_PID
def test_the_worker_paths_on_one_thread_share_its_kept_connection():
    ids = store_events(3)

    def work():
        opened = db.connections_opened(this_thread=True)
        pids = {db.thread_connection.run("SELECT pg_backend_pid()")[0][0]}
        links.ensure_links("newsletter", 1, ["https://example.com/a", "https://example.com/b"])
        webhook_apply.apply_events(ids)
        with db.transaction(db.thread_connection.get()) as cur:
            pids.add(pid(cur))
        pids.add(db.thread_connection.run("SELECT pg_backend_pid()")[0][0])
        return pids, db.connections_opened(this_thread=True) - opened

    pids, opened = on_new_thread(work)
    assert len(pids) == 1 and opened == 1


# -- transaction() on the pool's autocommit connections -------------------------------------------


def suppressed() -> list[str]:
    return [r[0] for r in db.query("SELECT email FROM suppressions ORDER BY email")]


def suppress(cur, email: str) -> None:
    cur.execute("INSERT INTO suppressions (email, reason, source) VALUES (%s, 'bounce', 'test')", (email,))


def test_transaction_commits_on_success_and_rolls_back_on_error_on_a_pooled_connection():
    with db.raw_cursor() as cur:
        assert cur.connection.autocommit  # peewee's pool: BEGIN is ours to send
        suppress(cur, "kept@example.com")
    with pytest.raises(RuntimeError), db.raw_cursor() as cur:
        suppress(cur, "gone@example.com")
        raise RuntimeError("after the first statement")
    assert suppressed() == ["kept@example.com"]


def test_a_transaction_inside_a_transaction_is_a_savepoint():
    with db.raw_cursor() as cur:
        suppress(cur, "outer@example.com")
        with pytest.raises(psycopg2.errors.UniqueViolation), db.transaction(cur.connection) as inner:
            suppress(inner, "inner@example.com")
            suppress(inner, "outer@example.com")
        with db.transaction(cur.connection) as inner:
            suppress(inner, "second@example.com")
    assert suppressed() == ["outer@example.com", "second@example.com"]


def test_an_aborted_transaction_is_never_reported_as_committed():
    with pytest.raises(psycopg2.errors.InFailedSqlTransaction), db.raw_cursor() as cur:
        suppress(cur, "lost@example.com")
        try:
            suppress(cur, "lost@example.com")  # fails, and the error is swallowed
        except psycopg2.errors.UniqueViolation:
            pass
    assert suppressed() == []
    with db.raw_cursor() as cur:  # the connection went back clean
        suppress(cur, "next@example.com")
    assert suppressed() == ["next@example.com"]


# -- connections whose server went away ---------------------------------------------------------


@pytest.fixture
def pool_through_proxy(settings, database_url):
    proxy, url = TcpProxy.for_url(database_url)
    settings(database_url=url)
    db.init(url)
    yield proxy
    proxy.cut()
    db.init(database_url)


@BY_PID
def test_pooled_connections_whose_server_went_away_are_never_lent_again(pool_through_proxy):
    proxy = pool_through_proxy
    with db.raw_cursor() as cur:
        first = pid(cur)
    proxy.cut()  # Postgres restarts: idle pooled connections die
    proxy.restore()
    with db.raw_cursor() as cur:  # no error: the dead one was discarded
        assert pid(cur) != first
    with pytest.raises(db.UNAVAILABLE), db.raw_cursor() as cur:
        pid(cur)
        proxy.cut()  # dies in the middle of a unit of work
        pid(cur)
    proxy.restore()
    assert db.query("SELECT 1") == [(1,)]
    with db.raw_cursor() as cur:
        pid(cur)


@BY_PID
def test_a_kept_connection_whose_server_went_away_is_reopened():
    ids = store_events(2)

    def work():
        before = db.thread_connection.run("SELECT pg_backend_pid()")[0][0]
        terminate(before)
        after = db.thread_connection.run("SELECT pg_backend_pid()")[0][0]  # retried once, transparently
        terminate(after)
        with pytest.raises(db.UNAVAILABLE):  # the actor retries the message ...
            webhook_apply.apply_events(ids[:1])
        assert webhook_apply.apply_events(ids) == 2  # ... on a fresh connection
        return before, after

    before, after = on_new_thread(work)
    assert before != after


def test_server_warnings_name_autovacuum_exactly_when_the_server_has_it_off():
    """Read off the real server (CI machines have run with autovacuum off): the scheduler logs it."""
    ((autovacuum,),) = db.query("SELECT current_setting('autovacuum')")
    warnings = db.server_warnings()
    assert bool(warnings) == (autovacuum != "on")
    assert all("autovacuum is off" in w and "docs/operations.md" in w for w in warnings)
