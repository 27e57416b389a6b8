"""Right to erasure: everything about a subscriber is deleted or anonymised in one transaction, their
address stays suppressed. What is deleted, anonymised and kept is listed in docs/api.md (DELETE).

Kept: the address in `suppressions` (reason 'erased'), the minimum needed to never mail it again
(honouring the objection needs the address: GDPR art. 17(3)(b), 21(3)); a hash would force every
suppression check (claims, outbox, webhooks) to match on hashes. Addresses are compared by their
canonical form (README "Address identity"), so every spelling a provider reported an event under is
found and the suppression kept is the canonical one. The audit row names no one: it records that an
operator erased somebody, and when.

Each domain erases its own tables (its step below); the order is the locks':
  1. the user's events (digest), whether or not they are a subscriber;
  2. the stored provider events under every address they were mailed at (tracking), before any lock
     the webhook worker may wait for (this subscriber row, the suppression key): it locks its
     webhook_events rows first, so taking them first too cannot deadlock;
  3. the subscriber row locked, the address suppressed as of now (it may just have changed);
  4. a digest is one person's mail: its links (URLs from their events), click history and counters
     go; newsletter clicks and opens stay as anonymous counts so the newsletter's statistics stay
     right; legacy codes keep resolving for nobody in particular;
  5. the subscriber row (their runs and outbox rows cascade), then their user_id leaves every
     newsletter audience — last, so those rows stay locked for the shortest time.
"""

from __future__ import annotations

from app.newsletter import rows as newsletter_rows
from app.operations import audit
from app.platform import db
from app.platform.addresses import canonical
from app.subscribers import records, suppressions
from digest import events as digest_events
from digest import runs as digest_runs
from tracking import legacy, links, recorder, webhook_apply, webhook_events

ACTION = "subscriber.erase"


def erase_subscriber(user_id: str, operator: audit.Operator) -> bool:
    """True if a subscriber existed (their events, and their user_id in audiences, go either way)."""
    with db.raw_cursor() as cur:
        erased = _erase(cur, user_id)
        audit.record(cur, operator, ACTION, "a subscriber", {"existed": erased})
    return erased


def _erase(cur: db.Cursor, user_id: str) -> bool:
    digest_events.erase(cur, user_id)
    existed = _erase_subscriber_row(cur, user_id)
    newsletter_rows.erase_from_audiences(cur, user_id)
    return existed


def _erase_subscriber_row(cur: db.Cursor, user_id: str) -> bool:
    found = records.find(cur, user_id)
    if found is None:
        return False
    subscriber_id, address = found
    mailed = {address} | {canonical(a) for a in newsletter_rows.addresses_mailed(cur, subscriber_id)}
    webhook_events.erase(cur, sorted(mailed), subscriber_id)
    locked = records.lock(cur, subscriber_id)  # the address as of now: it may just have changed
    if locked is None:  # erased concurrently
        return False
    run_ids = digest_runs.ids_of(cur, subscriber_id)
    suppressions.keep_erased(cur, locked)
    links.erase_mails(cur, "digest", run_ids)
    recorder.erase(cur, subscriber_id, "digest", run_ids)
    webhook_apply.erase_counts(cur, "digest", run_ids)
    legacy.anonymise(cur, subscriber_id)
    records.delete(cur, subscriber_id)
    return True
