"""Buffered writer of click/open history (email_link_history): the hot paths never wait for Postgres.

The click and open endpoints append a row to an in-process buffer and answer at once; one
background thread per web process writes the buffer every TRACKING_FLUSH_SECONDS (or sooner when
FLUSH_ROWS are waiting) with one COPY + INSERT … SELECT per flush (group commit).

Durability contract (documented in tracking/README.md, tested in tests/tracking/test_durability.py):
  * SIGTERM / normal shutdown: the buffer is flushed at interpreter exit, nothing is lost.
  * SIGKILL / crash: history rows recorded in the last TRACKING_FLUSH_SECONDS (plus the duration
    of a flush that was in flight, normally milliseconds) can be lost. Rows older than that are
    committed. The redirect itself never depends on this: only the statistic can be lost.
  * Postgres down: rows stay buffered (up to TRACKING_BUFFER_MAX_ROWS, then the oldest are dropped
    with an error log) and are written when it comes back.

The "clicked within N seconds of delivery" scanner rule needs the delivery time (email_log.sent_at
or digest_runs.completed_at); it is applied inside the flush's INSERT … SELECT, so the request
path needs no lookup for it.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import threading
import time

from app.platform import config, db

log = logging.getLogger("tracking.recorder")

FLUSH_ROWS = 5000  # wake the writer early when this many rows wait

STAGE_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS history_stage (kind text, link_id bigint, mail_kind text, "
    "mail_id bigint, subscriber_id bigint, ip inet, user_agent text, is_machine boolean, "
    "machine_reason text, occurred_epoch double precision) ON COMMIT DELETE ROWS"
)
STAGE_COLUMNS = (
    "kind",
    "link_id",
    "mail_kind",
    "mail_id",
    "subscriber_id",
    "ip",
    "user_agent",
    "is_machine",
    "machine_reason",
    "occurred_epoch",
)
# The delivery time of this recipient's copy of the mail decides the "too soon to be a human" rule.
# A click or open by an erased subscriber (buffered while they were erased, or an old mail clicked
# later) is kept only as an anonymous count: no subscriber id, IP or user agent (app/operations/erasure.py).
INSERT_FROM_STAGE = """
INSERT INTO email_link_history (kind, link_id, mail_kind, mail_id, subscriber_id, ip, user_agent,
                                is_machine, machine_reason, occurred_at)
SELECT s.kind, s.link_id, s.mail_kind, s.mail_id, sub.id,
       CASE WHEN erased THEN NULL ELSE s.ip END, CASE WHEN erased THEN NULL ELSE s.user_agent END,
       s.is_machine OR COALESCE(d.soon, false),
       COALESCE(s.machine_reason, CASE WHEN d.soon THEN 'soon_after_delivery' END),
       to_timestamp(s.occurred_epoch)
FROM history_stage s
LEFT JOIN subscribers sub ON sub.id = s.subscriber_id
CROSS JOIN LATERAL (SELECT s.subscriber_id IS NOT NULL AND sub.id IS NULL AS erased) e
LEFT JOIN LATERAL (
    SELECT to_timestamp(s.occurred_epoch) - delivered.at < make_interval(secs => %(window)s) AS soon
    FROM (SELECT CASE WHEN s.mail_kind = 'digest'
                      THEN (SELECT completed_at FROM digest_runs WHERE id = s.mail_id)
                      ELSE (SELECT sent_at FROM email_log
                            WHERE newsletter_id = s.mail_id AND subscriber_id = s.subscriber_id)
                 END AS at) delivered
) d ON true
-- A link deleted since the click (with its mail) must not fail the whole batch.
WHERE s.link_id IS NULL OR EXISTS (SELECT 1 FROM email_links l WHERE l.id = s.link_id)
"""


def _copy_field(value) -> str:
    if value is None:
        return "\\N"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, str):
        return (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
            .replace("\x00", "")
        )
    return str(value)


_NULL = "\\N"
_escaped_agents: dict[str, str] = {}


def _agent_field(user_agent: str | None) -> str:
    """User agents repeat a lot: escape each once."""
    if user_agent is None:
        return "\\N"
    hit = _escaped_agents.get(user_agent)
    if hit is None:
        hit = _copy_field(user_agent)
        if len(_escaped_agents) > 10_000:
            _escaped_agents.clear()
        _escaped_agents[user_agent] = hit
    return hit


def copy_line(
    kind: str,
    link_id,
    mail_kind: str,
    mail_id: int,
    subscriber_id,
    ip,
    user_agent,
    is_machine: bool,
    reason,
    occurred: float,
) -> str:
    """One history_stage row in COPY text format, built in the request (about a microsecond) so a
    flush is a join of ready strings: no long GIL-holding burst in the writer thread, and the
    buffer holds plain str objects the garbage collector never has to traverse."""
    n = _NULL
    return (
        f"{kind}\t{n if link_id is None else link_id}\t{mail_kind}\t{mail_id}\t"
        f"{n if subscriber_id is None else subscriber_id}\t{n if ip is None else ip}\t"
        f"{_agent_field(user_agent)}\t{'t' if is_machine else 'f'}\t{reason or n}\t{occurred:.6f}\n"
    )


class HistoryRecorder:
    def __init__(self, url: str | None = None):
        self._url = url
        self._lock = threading.Lock()  # guards _rows
        self._write_lock = threading.Lock()  # one flush at a time (thread, explicit flush, atexit)
        self._rows: list[str] = []
        self._wake = threading.Event()
        self._conn = None
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        self.dropped = 0

    # -- request side (event loop thread): no I/O, a lock and an append ---------------------------
    def add(self, row: str) -> None:
        """row: one line from copy_line()."""
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._rows.append(row)
            n = len(self._rows)
        if n >= FLUSH_ROWS:
            self._wake.set()

    def pending(self) -> int:
        return len(self._rows)

    # -- writer side --------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            # A forked child (uvicorn --workers) must not inherit the parent's buffer or connection.
            self._rows, self._conn, self._pid = [], None, os.getpid()
            self._thread = thread = threading.Thread(target=self._run, name="tracking-history-writer", daemon=True)
            thread.start()

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = db.connect_raw(self._url)
        return self._conn

    def _write(self, rows: list[str]) -> None:
        with db.transaction(self._connection()) as cur:
            # In the flush's own transaction: behind PgBouncer (transaction pooling) each flush may
            # run in a different server session, and a temp table exists only in the one that made
            # it. Where it exists already (a direct connection, a reused server session) this is a
            # catalog lookup; ON COMMIT DELETE ROWS leaves it empty for whoever comes next.
            cur.execute(STAGE_DDL)
            cur.copy_expert(f"COPY history_stage ({', '.join(STAGE_COLUMNS)}) FROM STDIN", io.StringIO("".join(rows)))
            cur.execute(INSERT_FROM_STAGE, {"window": config.get().tracking_scanner_seconds})

    def _write_one_by_one(self, rows: list[str]) -> None:
        """After a data/constraint error in a batch (e.g. a link deleted meanwhile): keep every
        good row, log and drop only the bad ones."""
        for i, row in enumerate(rows):
            try:
                self._write([row])
            except (db.DataError, db.IntegrityError) as exc:
                self.dropped += 1
                log.error("dropping unwritable history row %r: %s", row, exc)
            except BaseException:
                self._put_back(rows[i:])  # e.g. the connection died: keep what is not written yet
                raise

    def flush(self) -> int:
        """Write everything buffered now; returns the number of rows written. Raises if Postgres
        is unreachable (the rows are put back for the next attempt)."""
        with self._write_lock:
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            try:
                self._write(rows)
            except (db.DataError, db.IntegrityError) as exc:
                log.warning("history batch of %d rejected (%s); writing row by row", len(rows), exc)
                self._write_one_by_one(rows)
            except BaseException:
                self._put_back(rows)
                raise
            return len(rows)

    def _put_back(self, rows: list[str]) -> None:
        limit = config.get().tracking_buffer_max_rows
        with self._lock:
            self._rows = rows + self._rows
            excess = len(self._rows) - limit
            if excess > 0:
                del self._rows[:excess]
                self.dropped += excess
                log.error("history buffer over %d rows while Postgres is failing: dropped the oldest %d", limit, excess)

    def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.wait(timeout=config.get().tracking_flush_seconds)
            self._wake.clear()
            try:
                self.flush()
                backoff = 0.0
            except Exception as exc:
                # Sleep even if a full buffer keeps waking us: no reconnect storm while PG is down.
                backoff = min(max(backoff * 2, 0.5), 10.0)
                log.error("history flush failed (%d rows kept, retry in %.1fs): %s", self.pending(), backoff, exc)
                time.sleep(backoff)

    def flush_at_exit(self) -> None:
        if self._pid != os.getpid() or not self._rows:
            return
        try:
            n = self.flush()
            log.info("flushed %d history rows at shutdown", n)
        except Exception:
            log.exception("could not flush %d history rows at shutdown", self.pending())


_recorder: HistoryRecorder | None = None
_recorder_lock = threading.Lock()


def erase(cur: db.Cursor, subscriber_id: int, mail_kind: str, mail_ids: list[int]) -> None:
    """Right to erasure: the history of the subscriber's own mails (`mail_ids` of `mail_kind`, their
    digests) goes; their clicks and opens of shared mail (newsletters) stay as anonymous counts, so
    that mail's statistics stay right."""
    cur.execute("DELETE FROM email_link_history WHERE mail_kind = %s AND mail_id = ANY(%s)", (mail_kind, mail_ids))
    cur.execute(
        "UPDATE email_link_history SET subscriber_id = NULL, ip = NULL, user_agent = NULL WHERE subscriber_id = %s",
        (subscriber_id,),
    )


def recorder() -> HistoryRecorder:
    global _recorder
    if _recorder is None:
        with _recorder_lock:
            if _recorder is None:
                _recorder = HistoryRecorder()
                atexit.register(_recorder.flush_at_exit)
    return _recorder


def record(
    kind: str,
    link_id: int | None,
    mail_kind: str,
    mail_id: int,
    subscriber_id: int | None,
    ip: str | None,
    user_agent: str | None,
    reason: str | None,
) -> None:
    """A click (kind "click", its link) or an open (kind "open", link_id None); `reason` says why it
    is taken for a machine's, None for a person's."""
    recorder().add(
        copy_line(
            kind, link_id, mail_kind, mail_id, subscriber_id, ip, user_agent, reason is not None, reason, time.time()
        )
    )
