"""Database access for the newsletter hot path: one raw psycopg2 connection per thread.

Claims and marks are single statements in autocommit (each statement is its own transaction), and
execute_values needs a psycopg2 cursor, so the pooled peewee connection is not used here.
"""
from __future__ import annotations

import psycopg2.extras

from app import db

_connections = db.ThreadConnections(autocommit=True)


def run(sql: str, params=None, fetch: bool = True):
    """One statement; rows if it returns any. A dropped connection is reopened once."""
    def work(conn):
        with conn.cursor() as cur:
            cur.execute(sql, params)
            if fetch and cur.description:
                return cur.fetchall()
            return cur.rowcount
    return _connections.retry_once(work)


def execute_values(sql: str, rows, template: str, page_size: int = 1000):
    """execute_values in autocommit; a dropped connection is reopened once (callers' statements
    are idempotent: marks only touch rows still `sending`)."""
    def work(conn):
        with conn.cursor() as cur:
            psycopg2.extras.execute_values(cur, sql, rows, template=template, page_size=page_size)
            return cur.rowcount
    return _connections.retry_once(work)
