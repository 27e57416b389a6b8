"""Applying stored provider events: suppressions, soft-bounce counting, per-mail counters.

Runs in a worker (actors/webhooks.py) on ids enqueued after the webhook commit, and again from the
scheduler tick via requeue_unprocessed() for anything Redis lost (Redis is a hint; the
webhook_events row with processed_at NULL is the truth).

Exactly-once effect: the rows are locked (FOR UPDATE SKIP LOCKED, processed_at IS NULL) and marked
processed in the same transaction as their effects, so a redelivered or concurrent message finds
nothing left to do.

Mapping: SendGrid's custom_args come back flattened into each event (mail_kind, mail_id, row_id,
subscriber_id); events without them still suppress by email. The other providers' events (stored
with an id prefixed `ses:`, `postmark:` or `mailgun:`, by tracking/ses_events.py, postmark_events.py,
mailgun_events.py) carry no custom_args: their payload is {"provider", "message_id", "type",
"attempt", "raw": the provider's event}, already in this module's vocabulary, and the mail is found
by the provider's message id (email_log.provider_message_id: the outbox row and its newsletter;
digest_runs.provider_message_id: the run), never by the mail's original headers. One message id may
name several rows (Mailgun's batch sends share one): the row whose address is the event's counts.

An event only touches the recipient whose address it names (`email`, compared by its canonical form:
README "Address identity", so `Ana@Bücher.example` is `ana@xn--bcher-kva.example`). custom_args
are a second opinion, trusted only where they agree with that address, so an event about a@x can
never count against, reset or suppress b@x (a mis-mapped send, a replayed or, with the opt-out, an
unsigned forged event):
  * suppressions always go by the event's `email`, never by custom_args;
  * soft-bounce counting/reset narrows to subscriber_id only if that subscriber has the event's
    address; otherwise the id is ignored and the subscribers with that address are meant;
  * per-mail counters: a digest run is one recipient's mail, so it counts only if the run's
    subscriber has the event's address; a newsletter event that names its outbox row (row_id) or
    subscriber counts only if that row's / subscriber's address is the event's; one naming just the
    newsletter touches no recipient and counts at mail level (checking it would need a scan of the
    newsletter's outbox by address, with no index to help).
The addresses are looked up once per chunk (three indexed ANY() queries), not per event.

What each event does:
  bounce (type "blocked")           → suppression reason 'block', at once
  bounce (any other type)           → suppression reason 'bounce' (hard bounce), at once
  dropped "Bounced Address" / "Unsubscribed Address" / "Spam Reporting Address"
                                    → 'bounce' / 'unsubscribe' / 'spamreport' (SendGrid's own list)
  spamreport                        → 'spamreport', at once
  unsubscribe, group_unsubscribe    → 'unsubscribe', at once
  deferred                          → a soft bounce: SendGrid could not deliver yet and retries
                                      itself. Counted once per message (the event with attempt
                                      "1", or without an attempt field) in
                                      subscribers.soft_bounce_count; at SOFT_BOUNCE_LIMIT the
                                      address is suppressed with reason 'soft_bounce'.
  delivered                         → soft_bounce_count back to 0 (the limit counts consecutive
                                      trouble, not a lifetime total)
  every event with custom_args      → mail_event_counts(mail_kind, mail_id, event) + 1
  (other providers) every event whose message id names a mail to the event's address
                                    → mail_event_counts of that mail + 1
Suppressed emails are stored in canonical form. Events about an erased address (suppression reason
'erased', app/subscribers/records.py) are deleted once applied.
"""

from __future__ import annotations

import logging
from collections import Counter

from app.platform import config, db, metrics, queue
from app.platform.addresses import canonical
from app.subscribers import records, suppressions
from tracking import messages, webhook_events

log = logging.getLogger("tracking.webhook_apply")

APPLY_CHUNK = 500
REQUEUE_AFTER_SECONDS = 60
REQUEUE_MAX = 20_000
IMMEDIATE_SUPPRESSION = {"spamreport": "spamreport", "unsubscribe": "unsubscribe", "group_unsubscribe": "unsubscribe"}
DROPPED_REASONS = {
    "bounced address": "bounce",
    "unsubscribed address": "unsubscribe",
    "spam reporting address": "spamreport",
}
MAIL_KINDS = ("digest", "newsletter")
# The providers whose events are stored with their name as the id's prefix (tracking/webhook_intake.py).
PROVIDERS = ("ses", "postmark", "mailgun")


def provider_of(event_id: str | None) -> str:
    """Which provider reported the stored event with this id ("sendgrid" unless prefixed)."""
    prefix = (event_id or "").split(":", 1)[0]
    return prefix if prefix in PROVIDERS else "sendgrid"


def _int(value) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if 0 < n < 2**63 else None


def suppression_reason(event: str, payload: dict) -> str | None:
    if event == "bounce":
        return "block" if str(payload.get("type", "")).lower() == "blocked" else "bounce"
    if event == "dropped":
        return DROPPED_REASONS.get(str(payload.get("reason", "")).strip().lower())
    return IMMEDIATE_SUPPRESSION.get(event)


def is_counted_soft_bounce(event: str, payload: dict) -> bool:
    if event != "deferred":
        return False
    attempt = payload.get("attempt")
    return attempt is None or str(attempt).strip() in ("", "1")


def address_of(email) -> str:
    """The canonical form of an event's `email` ("" when it has none): what it is compared by,
    and stored as webhook_events.canonical_email."""
    return canonical(email.strip()) if isinstance(email, str) and email.strip() else ""


class Owners:
    """The addresses behind the custom_args of one chunk's events, read in three queries; and the
    mails behind the other providers' message ids, in two."""

    def __init__(self, cur, payloads: list[dict], message_ids: set | None = None):
        sub_ids, row_ids, run_ids = set(), set(), set()
        for p in payloads:
            sub_ids.add(_int(p.get("subscriber_id")))
            if p.get("mail_kind") == "newsletter":
                row_ids.add(_int(p.get("row_id")))
            elif p.get("mail_kind") == "digest":
                run_ids.add(_int(p.get("mail_id")))
        self.subscribers = self._lookup(cur, "SELECT id, canonical_email FROM subscribers WHERE id = ANY(%s)", sub_ids)
        self.outbox = {
            i: (nl, canonical(e))
            for i, nl, e in self._rows(
                cur, "SELECT id, newsletter_id, email FROM email_log WHERE id = ANY(%s)", row_ids
            )
        }
        self.runs = self._lookup(
            cur,
            "SELECT r.id, s.canonical_email FROM digest_runs r "
            "JOIN subscribers s ON s.id = r.subscriber_id WHERE r.id = ANY(%s)",
            run_ids,
        )
        # (message id, canonical address) -> (mail_kind, mail_id): rows whose address is another's
        # are keyed apart, so an event counts only against the mail sent to its own address.
        self.mails: dict[tuple[str, str], tuple[str, int]] = {}
        message_ids = set(message_ids or ())
        for _, nl, e, mid in self._rows(
            cur,
            "SELECT id, newsletter_id, email, provider_message_id FROM email_log WHERE provider_message_id = ANY(%s)",
            message_ids,
        ):
            self.mails[(mid, canonical(e))] = ("newsletter", nl)
        for i, address, mid in self._rows(
            cur,
            "SELECT r.id, s.canonical_email, r.provider_message_id FROM digest_runs r "
            "JOIN subscribers s ON s.id = r.subscriber_id WHERE r.provider_message_id = ANY(%s)",
            message_ids,
        ):
            self.mails[(mid, address)] = ("digest", i)

    def mail(self, message_id, address: str) -> tuple[str, int] | None:
        """The mail with this provider message id sent to this address, if any."""
        if not isinstance(message_id, str) or not address:
            return None
        return self.mails.get((message_id, address))

    @staticmethod
    def _rows(cur, sql: str, ids: set) -> list[tuple]:
        ids.discard(None)
        if not ids:
            return []
        cur.execute(sql, (sorted(ids),))
        return cur.fetchall()

    @classmethod
    def _lookup(cls, cur, sql: str, ids: set) -> dict:
        return dict(cls._rows(cur, sql, ids))

    def subscriber(self, subscriber_id: int | None, address: str) -> int | None:
        """subscriber_id if that subscriber has this address, else None (the id is ignored)."""
        if subscriber_id and address and self.subscribers.get(subscriber_id) == address:
            return subscriber_id
        return None

    def counts(self, mail_kind: str, mail_id: int, payload: dict, address: str) -> bool:
        if mail_kind == "digest":
            return bool(address) and self.runs.get(mail_id) == address
        row_id, subscriber_id = _int(payload.get("row_id")), _int(payload.get("subscriber_id"))
        if row_id:
            return bool(address) and self.outbox.get(row_id) == (mail_id, address)
        if subscriber_id:
            return self.subscriber(subscriber_id, address) is not None
        return True


def _apply_one(
    cur, event: str, address: str, payload: dict, counts: Counter, owners: Owners, provider: str = "sendgrid"
) -> None:
    if provider == "sendgrid":
        mail_kind = payload.get("mail_kind")
        mail_id = _int(payload.get("mail_id"))
        if mail_kind in MAIL_KINDS and mail_id and owners.counts(mail_kind, mail_id, payload, address):
            counts[(mail_kind, mail_id, event)] += 1
        subscriber_id = owners.subscriber(_int(payload.get("subscriber_id")), address)
    else:
        mail = owners.mail(payload.get("message_id"), address)
        if mail:
            counts[(*mail, event)] += 1
        subscriber_id = None  # by address: no subscriber id comes back from these providers
    reason = suppression_reason(event, payload)
    if reason:
        suppressions.suppress(cur, address, reason, f"{provider}:{event}")
        return
    if not subscriber_id and not address:
        return
    if is_counted_soft_bounce(event, payload):
        n = records.count_soft_bounce(cur, subscriber_id, address)
        if n >= config.get().soft_bounce_limit:
            suppressions.suppress(cur, address, "soft_bounce", f"{provider}:deferred x{n}")
    elif event == "delivered":
        records.reset_soft_bounces(cur, subscriber_id, address)


def apply_events(ids: list[int]) -> int:
    """Apply the stored events with these ids that are not processed yet; returns how many."""
    ids = sorted({int(i) for i in ids})
    done = 0
    for start in range(0, len(ids), APPLY_CHUNK):
        done += _apply_chunk(ids[start : start + APPLY_CHUNK])
    return done


def _apply_chunk(ids: list[int]) -> int:
    try:
        with db.transaction(db.thread_connection.get()) as cur:  # kept across messages
            return _apply_rows(cur, ids)
    except db.UNAVAILABLE:
        db.thread_connection.reset()  # the actor retries the chunk on a fresh connection
        raise


def _apply_rows(cur, ids: list[int]) -> int:
    rows = [
        (row_id, event, key or address_of(email), payload, key, provider_of(event_id))
        for row_id, event, email, payload, key, event_id in webhook_events.claim(cur, ids)
    ]
    payloads = [(payload, provider) for _, _, _, payload, _, provider in rows if isinstance(payload, dict)]
    owners = Owners(
        cur,
        [payload for payload, provider in payloads if provider == "sendgrid"],
        {
            p.get("message_id")
            for p, provider in payloads
            if provider != "sendgrid" and isinstance(p.get("message_id"), str)
        },
    )
    counts: Counter = Counter()
    errors: dict[int, str] = {}
    for row_id, event, address, payload, _, provider in rows:
        if not isinstance(payload, dict):
            errors[row_id] = "payload is not a JSON object"
            continue
        cur.execute("SAVEPOINT one_event")
        one: Counter = Counter()  # merged only if this event's effects stand
        try:
            _apply_one(cur, event, address, payload, one, owners, provider)
        except db.UNAVAILABLE:
            raise  # the connection is gone: the whole chunk is retried by the actor
        except Exception as exc:
            # e.g. an absurd email: record why and move on; retrying would fail the same way
            # forever, and the other events of the chunk must not wait for it.
            cur.execute("ROLLBACK TO SAVEPOINT one_event")
            errors[row_id] = f"{exc.__class__.__name__}: {str(exc).strip()[:500]}"
            log.warning("webhook event %s not applied: %s", row_id, errors[row_id])
        else:
            cur.execute("RELEASE SAVEPOINT one_event")
            counts.update(one)
    for (kind, mail_id, event), n in sorted(counts.items()):
        cur.execute(
            "INSERT INTO mail_event_counts (mail_kind, mail_id, event, count) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (mail_kind, mail_id, event) DO UPDATE "
            "SET count = mail_event_counts.count + EXCLUDED.count, updated_at = now()",
            (kind, mail_id, event, n),
        )
    if rows:
        webhook_events.mark_applied(cur, [r[0] for r in rows], errors)
        webhook_events.key_unkeyed(
            cur, [(row_id, address) for row_id, _, address, _, key, _ in rows if address and not key]
        )
        webhook_events.forget_erased(cur, [r[0] for r in rows])
        metrics.webhook_events(event for _, event, *_ in rows)
    return len(rows)


def erase_counts(cur: db.Cursor, mail_kind: str, mail_ids: list[int]) -> None:
    """The per-mail counters of these mails (an erased subscriber's digests: one person's mail)."""
    cur.execute("DELETE FROM mail_event_counts WHERE mail_kind = %s AND mail_id = ANY(%s)", (mail_kind, mail_ids))


def enqueue(ids: list[int]) -> None:
    """Hint the worker; a failure here loses nothing (requeue_unprocessed finds the rows)."""
    try:
        for start in range(0, len(ids), APPLY_CHUNK):
            queue.send(messages.APPLY_WEBHOOK_EVENTS, ids[start : start + APPLY_CHUNK])
    except Exception as exc:
        log.warning("could not enqueue %d webhook events (the scheduler will): %s", len(ids), exc)


def requeue_unprocessed() -> int:
    """Scheduler tick: re-enqueue stored events still unprocessed a minute after they arrived."""
    ids = webhook_events.unprocessed(REQUEUE_AFTER_SECONDS, REQUEUE_MAX)
    if ids:
        log.info("re-enqueueing %d unprocessed webhook events", len(ids))
        enqueue(ids)
    return len(ids)
