"""Outbox creation: one email_log row per recipient, inserted in chunks that each commit.

Each chunk is one `INSERT … SELECT … ON CONFLICT DO NOTHING` over a range of subscriber ids (or a
slice of the user_id list), so the worker streams through any audience in constant memory. A crash
leaves some chunks committed; the re-run (Dramatiq redelivers an un-acked message, or reclaim_stale
re-kicks) walks every chunk again and the unique (newsletter_id, subscriber_id) key turns the
already-written rows into no-ops: nobody twice, nobody missed. Unsubscribed or suppressed
subscribers get a row with status `suppressed` (visible in the counts, never sent).
"""

from __future__ import annotations

import logging
import time

from app.newsletter import kick, schedule, variants
from app.newsletter import rows as newsletter_rows
from app.platform import db, lease

log = logging.getLogger("app.newsletter.outbox")

CHUNK_IDS = 10_000  # subscriber id range per INSERT … SELECT (one short transaction each)
CHUNK_USER_IDS = 1_000
CANCEL_CHUNK = 10_000  # pending rows cancelled per short transaction
# One builder per newsletter: a lease (app/platform/lease.py), renewed while the builder lives. A builder
# that died leaves it to run out within LEASE_SECONDS; a redelivered message waits that long for it.
LEASE_SECONDS = 10.0
LEASE_PREFIX = "newsletter-outbox:"
# The claim's plan depends on how many pending rows the planner thinks this newsletter has. Until
# autovacuum next analyzes email_log it thinks "a handful" (a new newsletter_id, a table of mostly
# `sent` rows), picks a bitmap scan plus a sort of every pending row — a cost that grows with the
# outbox — instead of walking the pending index. So the builder analyzes after its first chunk and
# each time the outbox has grown this many times over, and at the end (docs/history.md, the cost).
ANALYZE_GROWTH = 4
ANALYZE_LOCK_TIMEOUT = "2s"  # a concurrent ANALYZE (autovacuum, another builder) refreshes them too


def lease_name(newsletter_id: int) -> str:
    return f"{LEASE_PREFIX}{newsletter_id}"


def create_outbox(newsletter_id: int, chunk_ids: int = CHUNK_IDS, on_chunk=None) -> int:
    """Build (or finish building) the outbox. Returns rows inserted by this run. `on_chunk(n)` is
    called after each committed chunk (progress logging; tests use it to crash mid-way)."""
    rows = db.thread_connection.run(
        "SELECT status, audience, outbox_completed_at, local_time, coalesce(send_at, send_requested_at, now()), "
        "variants FROM newsletters WHERE id = %s",
        (newsletter_id,),
    )
    if not rows:
        log.warning("outbox: newsletter %s does not exist (deleted?); nothing to do", newsletter_id)
        return 0
    status, audience, done_at, local_time, started, stored_variants = rows[0]
    if status in ("draft", "scheduled", "cancelled", "done") or audience is None:
        log.info("outbox: newsletter %s is %s; not building", newsletter_id, status)
        return 0
    if done_at is not None:
        _start_sending(newsletter_id)  # a duplicate message after completion: make sure chains run
        return 0
    builder = lease.Lease(lease_name(newsletter_id), LEASE_SECONDS)
    # Longer than a lease: a dead builder's lease runs out meanwhile, a live one's never does.
    if not builder.acquire(wait=LEASE_SECONDS * 1.5):
        log.info("outbox: newsletter %s is being built by another worker", newsletter_id)
        return 0
    with builder:
        builder.keep()
        # A re-run computes the same not_before: from the stored start, not from now.
        due = schedule.due_times(started, local_time)
        # Each recipient's variant, chosen as the row is written (app/newsletter/variants.py).
        choice = variants.parameters(stored_variants or {})
        return _build(newsletter_id, audience, chunk_ids, on_chunk, due, choice)


def _build(newsletter_id: int, audience: dict, chunk_ids: int, on_chunk, due: dict, choice: dict) -> int:
    started = time.monotonic()
    # Sending starts with the first chunk; chains idle-wait while the rest is written.
    db.thread_connection.call(newsletter_rows.start_sending, newsletter_id)
    inserted, kicked, analyzed_at = 0, False, 0
    for fill in _chunks(newsletter_id, audience, chunk_ids, due, choice):
        state = db.thread_connection.run("SELECT status FROM newsletters WHERE id = %s", (newsletter_id,))
        if not state or state[0][0] == "cancelled":
            # Rows written after the cancel's own sweep would otherwise linger as `pending`.
            cancel_pending_rows(newsletter_id)
            log.info("outbox: newsletter %s cancelled while building; stopped", newsletter_id)
            return inserted
        inserted += db.thread_connection.call(*fill)
        if inserted and inserted >= analyzed_at * ANALYZE_GROWTH:
            refresh_planner_statistics()
            analyzed_at = inserted
        if not kicked and inserted:
            _start_sending(newsletter_id)
            kicked = True
        if on_chunk:
            on_chunk(inserted)
    if inserted > analyzed_at:
        refresh_planner_statistics()
    db.thread_connection.call(newsletter_rows.outbox_complete, newsletter_id)
    if not kicked:
        _start_sending(newsletter_id)  # re-run that inserted nothing new: pending rows may remain
    log.info(
        "outbox: newsletter %s complete, %d row(s) inserted by this run in %.1fs",
        newsletter_id,
        inserted,
        time.monotonic() - started,
    )
    return inserted


def refresh_planner_statistics() -> bool:
    """ANALYZE email_log (a sample of 30,000 rows whatever the table's size: a fraction of a second).
    Skipped, not waited for, when another ANALYZE or VACUUM holds the table."""

    def work(conn):
        with db.transaction(conn) as cur:
            cur.execute(f"SET LOCAL lock_timeout = '{ANALYZE_LOCK_TIMEOUT}'")
            cur.execute("ANALYZE email_log")

    try:
        db.thread_connection.retry_once(work)
        return True
    except db.LockNotAvailable:
        log.info("outbox: email_log is being analyzed or vacuumed already; statistics refresh skipped")
        return False


def _chunks(newsletter_id: int, audience: dict, chunk_ids: int, due: dict, choice: dict):
    """(rows function, its arguments after the cursor) per chunk of the audience."""
    if audience.get("kind") == "user_ids":
        user_ids = audience.get("user_ids", [])
        for i in range(0, len(user_ids), CHUNK_USER_IDS):
            yield newsletter_rows.fill_user_ids, newsletter_id, user_ids[i : i + CHUNK_USER_IDS], due, choice
        return
    lo, hi = db.thread_connection.run("SELECT coalesce(min(id), 0) - 1, coalesce(max(id), 0) FROM subscribers")[0]
    while lo < hi:
        yield newsletter_rows.fill_range, newsletter_id, lo, min(lo + chunk_ids, hi), due, choice
        lo += chunk_ids


def _start_sending(newsletter_id: int) -> None:
    """Kick send chains unless some are already running (their alive mark is fresh)."""
    if kick.is_alive(newsletter_id):
        return
    kick.send_chains(newsletter_id)


def cancel_pending_rows(newsletter_id: int) -> int:
    """pending -> cancelled in chunks, each its own short transaction: a million pending rows never
    become one long write lock, and an interrupted cancel is still a cancel (claims stopped first)."""
    cancelled = 0
    while True:
        n = db.call(newsletter_rows.cancel_pending, newsletter_id, CANCEL_CHUNK)
        cancelled += n
        if n < CANCEL_CHUNK:
            return cancelled
