"""Database access for the newsletter hot path: one raw psycopg2 connection per thread.

Claims and marks are single statements in autocommit (each statement is its own transaction), and
execute_values needs a psycopg2 cursor, so the pooled peewee connection is not used here.
"""
from __future__ import annotations

import logging
import threading

import psycopg2
import psycopg2.extras

from app import config, db

log = logging.getLogger("app.newsletter.store")
_local = threading.local()


def connection():
    """This thread's autocommit connection, reopened if it was closed or the URL changed."""
    url = config.get().database_url
    conn = getattr(_local, "conn", None)
    if conn is not None and (conn.closed or getattr(_local, "url", None) != url):
        _close_quietly(conn)
        conn = None
    if conn is None:
        conn = db.connect_raw(url, autocommit=True)
        _local.conn, _local.url = conn, url
    return conn


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except Exception:  # already broken: nothing to release
        pass


def reset() -> None:
    """Drop this thread's connection (after a connection-level error, or in tests)."""
    conn = getattr(_local, "conn", None)
    if conn is not None:
        _close_quietly(conn)
    _local.conn = None


def run(sql: str, params=None, fetch: bool = True):
    """One statement; rows if it returns any. A dropped connection is reopened once."""
    for attempt in (1, 2):
        conn = connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                if fetch and cur.description:
                    return cur.fetchall()
                return cur.rowcount
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            reset()
            if attempt == 2:
                raise
            log.warning("newsletter DB connection lost; reconnecting")


def execute_values(sql: str, rows, template: str, page_size: int = 1000):
    """execute_values in autocommit; a dropped connection is reopened once (callers' statements
    are idempotent: marks only touch rows still `sending`)."""
    for attempt in (1, 2):
        conn = connection()
        try:
            with conn.cursor() as cur:
                psycopg2.extras.execute_values(cur, sql, rows, template=template, page_size=page_size)
                return cur.rowcount
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            reset()
            if attempt == 2:
                raise
            log.warning("newsletter DB connection lost; reconnecting")
