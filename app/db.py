"""Database access: one peewee database (pooled) plus raw psycopg2 connections for bulk paths.

Models mirror sql/migrations; the SQL files are the schema, peewee never creates tables.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from urllib.parse import urlparse

import psycopg2
import psycopg2.extras
from peewee import (
    AutoField,
    BigIntegerField,
    BlobField,
    BooleanField,
    DateField,
    ForeignKeyField,
    IntegerField,
    Model,
    SmallIntegerField,
    TextField,
)
from playhouse.db_url import parse as parse_db_url
from playhouse.postgres_ext import (
    ArrayField,
    BinaryJSONField,
    DateTimeTZField,
    PooledPostgresqlExtDatabase,
)

from app import config

log = logging.getLogger("app.db")

database = PooledPostgresqlExtDatabase(None, autoconnect=True)
_bound_url: str | None = None


def init(url: str | None = None) -> PooledPostgresqlExtDatabase:
    """Point the shared peewee database at DATABASE_URL (idempotent)."""
    global _bound_url
    settings = config.get()
    url = url or settings.database_url
    if _bound_url == url:
        return database
    if _bound_url is not None:
        database.close_all()
    params = parse_db_url(url)
    name = params.pop("database")
    # timeout: a burst of threadpool requests waits for a free connection instead of failing.
    database.init(name, max_connections=settings.db_pool_size, stale_timeout=300,
                  timeout=settings.db_pool_timeout_seconds, **params)
    _bound_url = url
    return database


def connect_raw(url: str | None = None, autocommit: bool = False):
    """A plain psycopg2 connection, for bulk writers that must own their transaction."""
    conn = psycopg2.connect(url or config.get().database_url)
    conn.autocommit = autocommit
    return conn


class ThreadConnections:
    """One raw psycopg2 connection per thread, kept open across calls (opening one per message
    would cost more than the work it serves); reopened when closed or DATABASE_URL changed."""

    def __init__(self, autocommit: bool = False):
        self.autocommit = autocommit
        self._local = threading.local()

    def get(self):
        url = config.get().database_url
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or self._local.url != url):
            self.reset()
            conn = None
        if conn is None:
            conn = connect_raw(url, autocommit=self.autocommit)
            self._local.conn, self._local.url = conn, url
        return conn

    def reset(self) -> None:
        """Drop this thread's connection (after an error that may have left it in an unknown state)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to release
                pass

    def retry_once(self, work):
        """work(connection). A connection that died while kept open (server restart, idle
        timeout) is reopened and the work tried once more: only for idempotent work."""
        for attempt in (1, 2):
            try:
                return work(self.get())
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self.reset()
                if attempt == 2:
                    raise
                log.warning("database connection lost; reconnecting")


@contextlib.contextmanager
def transaction(conn):
    """A cursor whose work commits on success and rolls back on error. A connection that cannot
    even roll back (the server went away) is closed, so its owner reopens it next time."""
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        try:
            conn.rollback()
        except psycopg2.Error:
            conn.close()
        raise


@contextlib.contextmanager
def raw_cursor(url: str | None = None):
    """Short-lived connection + cursor, committed on success, rolled back on error."""
    conn = connect_raw(url)
    try:
        with transaction(conn) as cur:
            yield cur
    finally:
        conn.close()


def database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/") or "postgres"


class BaseModel(Model):
    class Meta:
        database = database


class ApiKey(BaseModel):
    id = AutoField()
    name = TextField()
    scope = TextField()
    key_prefix = TextField()
    key_hash = BlobField(unique=True)
    created_at = DateTimeTZField()
    revoked_at = DateTimeTZField(null=True)

    class Meta:
        table_name = "api_keys"


class Subscriber(BaseModel):
    id = AutoField()
    user_id = TextField(unique=True)
    email = TextField()
    name = TextField(default="")
    timezone = TextField(default="UTC")
    digest_cadence = TextField(default="daily")
    digest_hour = SmallIntegerField(default=9)
    digest_weekday = SmallIntegerField(default=0)
    category_opt_outs = ArrayField(TextField, default=list)
    paused_until = DateTimeTZField(null=True)
    unsubscribed_at = DateTimeTZField(null=True)
    tracking_opt_out = BooleanField(default=False)
    token_version = IntegerField(default=1)
    soft_bounce_count = IntegerField(default=0)
    created_at = DateTimeTZField()
    updated_at = DateTimeTZField()

    class Meta:
        table_name = "subscribers"


class DigestRun(BaseModel):
    id = AutoField()
    subscriber = ForeignKeyField(Subscriber, column_name="subscriber_id", on_delete="CASCADE")
    cadence = TextField()
    period = DateField()
    scheduled_for = DateTimeTZField()
    status = TextField(default="pending")
    attempts = IntegerField(default=0)
    next_attempt_at = DateTimeTZField(null=True)
    enqueued_at = DateTimeTZField(null=True)
    claimed_at = DateTimeTZField(null=True)
    completed_at = DateTimeTZField(null=True)
    event_count = IntegerField(null=True)
    provider_message_id = TextField(null=True)
    last_error = TextField(null=True)
    skip_reason = TextField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        table_name = "digest_runs"


class DigestEvent(BaseModel):
    id = AutoField()
    source = TextField()
    producer_id = TextField()
    user_id = TextField()
    category = TextField()
    entity_type = TextField()
    entity_id = TextField()
    actor_id = TextField(null=True)
    actor_name = TextField(null=True)
    payload = BinaryJSONField(default=dict)
    occurred_at = DateTimeTZField()
    received_at = DateTimeTZField()
    digest_run = ForeignKeyField(DigestRun, column_name="digest_run_id", null=True)

    class Meta:
        table_name = "digest_events"


class Newsletter(BaseModel):
    id = AutoField()
    subject = TextField()
    html = TextField()
    text = TextField(null=True)
    from_addr = TextField(null=True)
    status = TextField(default="draft")
    audience = BinaryJSONField(null=True)
    created_at = DateTimeTZField()
    send_requested_at = DateTimeTZField(null=True)
    outbox_completed_at = DateTimeTZField(null=True)
    completed_at = DateTimeTZField(null=True)

    class Meta:
        table_name = "newsletters"


class EmailLog(BaseModel):
    id = AutoField()
    newsletter = ForeignKeyField(Newsletter, column_name="newsletter_id", on_delete="CASCADE")
    subscriber = ForeignKeyField(Subscriber, column_name="subscriber_id", on_delete="CASCADE")
    email = TextField()
    status = TextField(default="pending")
    attempts = IntegerField(default=0)
    next_attempt_at = DateTimeTZField(null=True)
    claimed_at = DateTimeTZField(null=True)
    sent_at = DateTimeTZField(null=True)
    provider_message_id = TextField(null=True)
    error = TextField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        table_name = "email_log"


class EmailLink(BaseModel):
    id = AutoField()
    mail_kind = TextField()
    mail_id = BigIntegerField()
    url = TextField()
    url_hash = BlobField()
    created_at = DateTimeTZField()

    class Meta:
        table_name = "email_links"


class EmailLinkHistory(BaseModel):
    id = AutoField()
    kind = TextField()
    link = ForeignKeyField(EmailLink, column_name="link_id", null=True)
    mail_kind = TextField()
    mail_id = BigIntegerField()
    subscriber_id = BigIntegerField(null=True)
    ip = TextField(null=True)
    user_agent = TextField(null=True)
    is_machine = BooleanField(default=False)
    machine_reason = TextField(null=True)
    occurred_at = DateTimeTZField()

    class Meta:
        table_name = "email_link_history"


class LegacyLinkCode(BaseModel):
    code = TextField(primary_key=True)
    link = ForeignKeyField(EmailLink, column_name="link_id")
    subscriber_id = BigIntegerField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        table_name = "legacy_link_codes"


class WebhookEvent(BaseModel):
    id = AutoField()
    sg_event_id = TextField(unique=True)
    event = TextField()
    email = TextField(null=True)
    payload = BinaryJSONField()
    received_at = DateTimeTZField()
    processed_at = DateTimeTZField(null=True)
    error = TextField(null=True)

    class Meta:
        table_name = "webhook_events"


class Suppression(BaseModel):
    id = AutoField()
    email = TextField(unique=True)
    reason = TextField()
    source = TextField(null=True)
    created_at = DateTimeTZField()

    class Meta:
        table_name = "suppressions"


ALL_TABLES = [
    "api_keys", "subscribers", "digest_runs", "digest_events", "newsletters", "email_log",
    "email_links", "email_link_history", "legacy_link_codes", "webhook_events", "suppressions",
    "mail_event_counts",
]


def query(sql: str, params=None) -> list[tuple]:
    """One statement on a pooled connection (autocommit); returns rows if any."""
    with database.connection_context():
        cursor = database.execute_sql(sql, params)
        return cursor.fetchall() if cursor.description else []
