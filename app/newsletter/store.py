"""Database access for the newsletter hot path, on the worker thread's kept connection
(db.thread_connection): claims and marks are single statements in autocommit (each statement is its
own transaction), several per message, so no pool check-out per statement.
"""

from __future__ import annotations

import psycopg2.extras

from app.platform import db


def run(sql: str, params=None, fetch: bool = True):
    """One statement; rows if it returns any. A dropped connection is reopened once."""

    def work(conn):
        with conn.cursor() as cur:
            cur.execute(sql, params)
            if fetch and cur.description:
                return cur.fetchall()
            return cur.rowcount

    return db.thread_connection.retry_once(work)


def execute_values(sql: str, rows, template: str, page_size: int = 1000):
    """execute_values in autocommit; a dropped connection is reopened once (callers' statements
    are idempotent: marks only touch rows still `sending`)."""

    def work(conn):
        with conn.cursor() as cur:
            psycopg2.extras.execute_values(cur, sql, rows, template=template, page_size=page_size)
            return cur.rowcount

    return db.thread_connection.retry_once(work)
