"""Claims a live process holds are renewed (app/platform/holds.py), and the scheduler's reclaimers
wait after an outage until live holders could renew theirs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg2

from app.cli import scheduler
from app.newsletter import reclaim
from app.newsletter import rows as newsletter_rows
from app.platform import db, holds
from digest import plan as digest_plan
from digest import runs as digest_runs
from tests import factories
from tests import newsletter_support as nl
from tests.digest_support import run_row

LONG_AGO = datetime.now(UTC) - timedelta(days=1)


def _stuck_run() -> int:
    """A digest run `processing`, claimed a day ago."""
    subscriber = factories.subscriber(f"u{time.monotonic_ns()}")
    return factories.digest_run(subscriber, status="processing", claimed_at=LONG_AGO)


def _later() -> float:
    """A moment on the renewer's clock when every hold is due."""
    return time.monotonic() + 3600


def test_a_held_claim_is_renewed_and_the_watchdog_leaves_it_then_takes_it_once_closed():
    run = _stuck_run()
    with holds.hold("digest runs", [run], digest_runs.renew, 300) as held:
        assert held in holds.held()
        assert holds.renew_due(_later()) == 1
        assert run_row(run)["claimed_at"] > datetime.now(UTC) - timedelta(minutes=1)
        assert digest_plan.watchdog(datetime.now(UTC)) == (0, 0)  # its holder is alive
    assert held not in holds.held()
    assert digest_plan.watchdog(datetime.now(UTC) + timedelta(seconds=301)) == (1, 0)  # closed: taken back
    assert run_row(run)["status"] == "pending"


def test_a_young_claim_costs_no_statement():
    run = _stuck_run()
    with holds.hold("digest runs", [run], digest_runs.renew, 300):
        assert holds.renew_due() == 0  # a third of the timeout has not passed
    assert run_row(run)["claimed_at"] == LONG_AGO


def test_only_rows_still_claimed_are_renewed():
    """A row recorded meanwhile (sent) keeps its claim time: the renewal touches `sending` rows only."""
    factories.seed_subscribers(3)
    newsletter_id = factories.newsletter()
    nl.start(newsletter_id)
    claimed = db.call(newsletter_rows.claim, newsletter_id, 10, 0)
    ids = [r.id for r in claimed]
    db.query("UPDATE email_log SET claimed_at = %s WHERE id = ANY (%s)", (LONG_AGO, ids))
    db.query("UPDATE email_log SET status = 'sent' WHERE id = %s", (ids[0],))
    with holds.hold("newsletter rows", ids, newsletter_rows.renew, 300):
        assert holds.renew_due(_later()) == 2


def test_a_renewal_skips_rows_being_written_instead_of_waiting(direct_database_url):
    run, other = _stuck_run(), _stuck_run()
    writer = psycopg2.connect(direct_database_url)
    try:
        with writer.cursor() as cur:  # the holder writing its outcome: the row is locked
            cur.execute("SELECT 1 FROM digest_runs WHERE id = %s FOR UPDATE", (run,))
        done = []
        with holds.hold("digest runs", [run, other], digest_runs.renew, 300):
            worker = threading.Thread(target=lambda: done.append(holds.renew_due(_later())), daemon=True)
            worker.start()
            worker.join(10)
        assert done == [1]  # the free one, at once
    finally:
        writer.close()


def test_the_scheduler_takes_nothing_back_until_it_has_seen_the_database_for_the_grace(settings):
    """Just after an outage every claim looks old, a live holder's too: the reclaimers wait."""
    settings(reclaim_after_seconds=60)
    factories.seed_subscribers(2)
    newsletter_id = factories.newsletter()
    nl.start(newsletter_id)
    rows = [r.id for r in db.call(newsletter_rows.claim, newsletter_id, 10, 0)]
    db.query("UPDATE email_log SET claimed_at = %s WHERE id = ANY (%s)", (LONG_AGO, rows))
    run = _stuck_run()

    result = scheduler.tick(send=lambda ids: None, depth=lambda: 0, watched=holds.GRACE_SECONDS / 2)
    assert result["reclaimed"] == 0 and "reclaim_waits" in result
    assert result["hooks"]["newsletter_reclaim"]["reclaimed_rows"] == 0
    assert run_row(run)["status"] == "processing" and nl.counts(newsletter_id) == {"sending": 2}

    result = scheduler.tick(send=lambda ids: None, depth=lambda: 0, watched=holds.GRACE_SECONDS)
    assert result["reclaimed"] == 1 and result["hooks"]["newsletter_reclaim"]["reclaimed_rows"] == 2
    assert run_row(run)["status"] == "pending" and nl.counts(newsletter_id) == {"pending": 2}


def test_watched_seconds_starts_again_when_the_connection_is_new():
    db.thread_connection.reset()
    assert db.watched_seconds() < holds.GRACE_SECONDS  # just opened
    assert reclaim.reclaim_stale(take_back=False)["reclaimed_rows"] == 0
