"""Scheduler-tick hook ("app.newsletter.reclaim:reclaim_stale"): repair what crashed workers and a
flushed Redis leave behind. Postgres is the truth; this turns it back into work.

1. `sending` rows whose claim is older than RECLAIM_AFTER_SECONDS (their worker died mid-batch: a
   live one renews it, app/platform/holds.py) go back to `pending`; they are re-sent with the same
   idempotency keys.
2. Newsletters that should be making progress get messages again: an unfinished outbox whose
   builder is gone (its lease in `leases` ran out or was released) gets create_outbox; a `sending`
   newsletter with due pending rows and no live send chain (its Redis alive mark expired) gets
   send chains.
Both are safe to repeat: the outbox builder takes a lease and inserts ON CONFLICT DO NOTHING;
extra send chains only claim rows nobody holds.
"""

from __future__ import annotations

import logging

from app.newsletter import kick, outbox
from app.newsletter import rows as newsletter_rows
from app.platform import config, db

log = logging.getLogger("app.newsletter.reclaim")

OUTBOX_GRACE_SECONDS = 60  # a just-requested send's create_outbox message is probably still queued
# Newsletters with pending rows due now. Every row of a local_time newsletter has a not_before: its
# earliest comes first from the not_before index (one index entry), so a send whose recipients are
# all hours away costs the tick nothing; only once some are due does EXISTS look for one not in
# backoff.
SENDING_WITH_DUE_ROWS = """
SELECT n.id FROM newsletters n WHERE n.status = 'sending' AND CASE WHEN n.local_time IS NULL
    THEN EXISTS (SELECT 1 FROM email_log e WHERE e.newsletter_id = n.id AND e.status = 'pending'
                 AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now()))
    ELSE (SELECT min(e.not_before) FROM email_log e
          WHERE e.newsletter_id = n.id AND e.status = 'pending' AND e.not_before IS NOT NULL) <= now()
         AND EXISTS (SELECT 1 FROM email_log e WHERE e.newsletter_id = n.id AND e.status = 'pending'
                     AND e.not_before <= now() AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())) END
"""


def reclaim_stale(take_back: bool = True) -> dict:
    """Both repairs; with take_back=False only the second (the scheduler waits after an outage until
    live holders renewed their claims: app/platform/holds.py)."""
    settings = config.get()
    reclaimed_rows = (
        db.thread_connection.call(newsletter_rows.reclaim, settings.reclaim_after_seconds) if take_back else []
    )
    reclaimed: dict[int, int] = {}
    for newsletter_id in reclaimed_rows:
        reclaimed[newsletter_id] = reclaimed.get(newsletter_id, 0) + 1
    for newsletter_id, n in reclaimed.items():
        log.warning("newsletter %s: %d stale sending row(s) back to pending", newsletter_id, n)

    kicked_outbox, kicked_chains = [], []
    stalled_outboxes = db.thread_connection.run(
        "SELECT n.id FROM newsletters n WHERE n.status IN ('queued', 'sending', 'paused') "
        "AND n.outbox_completed_at IS NULL "
        # a scheduled send started at send_at: its outbox message was sent then, not at the request
        "AND greatest(n.send_requested_at, n.send_at) < now() - make_interval(secs => %s) "
        "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = %s || n.id AND l.expires_at >= now())",
        (OUTBOX_GRACE_SECONDS, outbox.LEASE_PREFIX),
    )
    for (newsletter_id,) in stalled_outboxes:
        try:
            kick.outbox(newsletter_id)
            kicked_outbox.append(newsletter_id)
        except Exception as exc:
            log.error("newsletter %s: could not re-kick the outbox: %s", newsletter_id, exc)

    sending = db.thread_connection.run(SENDING_WITH_DUE_ROWS)
    for (newsletter_id,) in sending:
        try:
            alive = kick.is_alive(newsletter_id)
            if newsletter_id in reclaimed or not alive:
                kick.send_chains(newsletter_id, 1 if alive else None)
                kicked_chains.append(newsletter_id)
        except Exception as exc:
            log.error("newsletter %s: could not re-kick send chains: %s", newsletter_id, exc)
    # A newsletter whose last rows were finished by a worker that died before the done check.
    finished = db.thread_connection.call(newsletter_rows.finish, None)
    if kicked_outbox or kicked_chains:
        log.info("reclaim: outbox re-kicked for %s, send chains for %s", kicked_outbox, kicked_chains)
    return {
        "reclaimed_rows": len(reclaimed_rows),
        "outbox_kicked": kicked_outbox,
        "chains_kicked": kicked_chains,
        "finished": finished,
    }
