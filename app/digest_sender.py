"""Claim due digest runs, build each digest, send, then mark — the body of build_and_send_digest.

One call handles a batch of runs (DIGEST_CLAIM_BATCH) so the fixed costs — a claim query, one
event query, one payload query, one final transaction, pooled SMTP connections — are paid once per
batch instead of once per subscriber.

State machine of a run (the row is the truth, the Dramatiq message only a hint):
  pending --claim--> processing --provider accepted--> sent (events marked in the same transaction)
                                --no events-----------> skipped
                                --transient failure---> pending (attempts+1, next_attempt_at backoff)
                                --permanent / too many-> failed (last_error kept)
  pending --suppressed at claim time--> skipped
  processing --crash--> (watchdog in app/digest_planner.py) --> pending, attempts+1

Crash safety: if the process dies after the provider accepted a mail but before the final commit,
the run is still `processing`; the watchdog returns it to `pending` and the re-send carries the same
idempotency key (and Message-ID). Events are marked only in that final commit, and only the ids this
run loaded, so an event that arrived meanwhile waits for the next digest.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import psycopg2

from app import config, db, mail, tokens
from app.providers import get_provider
from app.providers.base import OutgoingMail, PermanentError, Provider, SendResult, TransientError
from digest import context as digest_context
from digest import group as digest_group
from digest import load as digest_load
from digest import render as digest_render

log = logging.getLogger("app.digest_sender")

MAX_BACKOFF_SECONDS = 6 * 3600


@dataclass
class ClaimedRun:
    id: int
    cadence: str
    attempts: int
    subscriber_id: int
    user_id: str
    email: str
    name: str
    subscriber_cadence: str
    token_version: int
    tracking_opt_out: bool
    unsubscribed: bool
    paused: bool
    suppressed: bool
    digest: digest_group.Digest | None = None
    mail: OutgoingMail | None = None
    error: str | None = None           # rendering failed: retried later, the others go ahead

    def skip_reason(self) -> str | None:
        if self.unsubscribed:
            return "unsubscribed"
        if self.suppressed:
            return "suppressed"
        if self.paused:
            return "paused"
        if self.subscriber_cadence != self.cadence:
            return "cadence changed"
        return None


@dataclass
class Outcome:
    sent: list = field(default_factory=list)        # (run_id, event_ids, message_id)
    skipped: list = field(default_factory=list)     # (run_id, reason)
    retry: list = field(default_factory=list)       # (run_id, error)
    failed: list = field(default_factory=list)      # (run_id, error)

    def counts(self) -> dict:
        return {"sent": len(self.sent), "skipped": len(self.skipped), "retry": len(self.retry),
                "failed": len(self.failed)}


# -- connections ------------------------------------------------------------------------------
# One connection per worker thread, kept open; dropped after any error (it may be in an unknown state).
connections = db.ThreadConnections()


def _pg_array(values) -> str:
    """'{1,2,3}' for a ::bigint[] / ::int[] parameter. psycopg2 would send ARRAY[1,2,3], which Postgres
    parses element by element: for the ~1000 event ids of a batch that doubled the statement's cost."""
    return "{" + ",".join(map(str, values)) + "}"


# -- claim ------------------------------------------------------------------------------------
_CLAIM_SQL = """
WITH picked AS (
    SELECT r.id FROM digest_runs r
    WHERE r.status = 'pending' AND {condition}
    ORDER BY r.scheduled_for, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE digest_runs r SET status = 'processing', claimed_at = now()
FROM picked, subscribers s
WHERE r.id = picked.id AND s.id = r.subscriber_id
RETURNING r.id, r.cadence, r.attempts, s.id, s.user_id, s.email, s.name, s.digest_cadence,
          s.token_version, s.tracking_opt_out, s.unsubscribed_at IS NOT NULL,
          coalesce(s.paused_until > now(), false),
          EXISTS (SELECT 1 FROM suppressions x WHERE x.email = lower(s.email))
"""


def claim(cur, run_ids: list[int] | None, limit: int) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Claim runs (given ids, or any due ones) and apply the claim-time suppression check.
    Returns (runs to build, [(run_id, skip_reason)]) — skips are already written, same transaction."""
    if run_ids is not None:
        # The checker decided these are due; a stale duplicate message must still not cut a
        # retry's backoff short.
        condition = "r.id = ANY (%(ids)s) AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= now())"
    else:
        condition = "r.scheduled_for <= now() AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= now())"
    cur.execute(_CLAIM_SQL.format(condition=condition), {"ids": list(run_ids or []), "limit": limit})
    claimed = [ClaimedRun(*row) for row in cur.fetchall()]
    claimed.sort(key=lambda r: r.id)
    # One run of a subscriber at a time: two runs would read the same unsent events. Checked once
    # per batch over the (few) processing runs; as a NOT EXISTS inside the claim, Postgres rescanned
    # every processing run once per candidate.
    busy = set()
    if claimed:
        cur.execute("SELECT subscriber_id FROM digest_runs WHERE status = 'processing' "
                    "AND subscriber_id = ANY (%s) AND NOT (id = ANY (%s))",
                    ([r.subscriber_id for r in claimed], [r.id for r in claimed]))
        busy = {row[0] for row in cur.fetchall()}
    runs, skipped, release, seen = [], [], [], set(busy)
    for run in claimed:
        reason = run.skip_reason()
        if run.subscriber_id in seen:
            release.append(run.id)        # a second run of one subscriber in this batch: later
        elif reason:
            skipped.append((run.id, reason))
        else:
            runs.append(run)
        seen.add(run.subscriber_id)
    if skipped:
        _mark_skipped(cur, skipped)
    if release:
        cur.execute("UPDATE digest_runs SET status = 'pending', claimed_at = NULL, enqueued_at = NULL "
                    "WHERE id = ANY (%s)", (release,))
    return runs, skipped


def _mark_skipped(cur, skipped: list[tuple[int, str]]) -> None:
    cur.execute(
        "UPDATE digest_runs r SET status = 'skipped', skip_reason = v.reason, event_count = 0, "
        "completed_at = now() FROM unnest(%s::bigint[], %s::text[]) AS v(id, reason) WHERE r.id = v.id",
        ([i for i, _ in skipped], [reason for _, reason in skipped]))


# -- build ------------------------------------------------------------------------------------
def build_digests(cur, runs: list[ClaimedRun], settings=None) -> list[ClaimedRun]:
    """Load events and render each run's mail. Returns the runs that have something to send;
    run.digest is None for the empty ones."""
    settings = settings or config.get()
    events = digest_load.load_unsent(cur, [r.subscriber_id for r in runs], settings.digest_event_page,
                                     settings.digest_max_events)
    for run in runs:
        evs = events.get(run.subscriber_id) or []
        run.digest = digest_group.build(evs, settings.digest_max_items) if evs else None
    shown = [g.latest_event_id for r in runs if r.digest for g in r.digest.groups]
    payloads = digest_load.load_payloads(cur, shown)
    from tracking.links import LinkRewriter  # the tracking package owns link rewriting

    ready = []
    for run in runs:
        if run.digest is None:
            continue
        try:
            run.mail = render_mail(run, payloads, settings, LinkRewriter)
        except digest_render.TemplateError:
            raise                      # every run would fail the same way: the caller retries all
        except Exception as exc:       # one odd subscriber or payload must not hold up the batch
            log.exception("rendering digest run %s failed", run.id)
            run.error = f"render failed: {exc!r}"
            continue
        ready.append(run)
    return ready


def render_mail(run: ClaimedRun, payloads: dict, settings, rewriter_class) -> OutgoingMail:
    unsubscribe_url = tokens.unsubscribe_url(run.subscriber_id, run.token_version)
    ctx = digest_context.build(
        run.digest, payloads, cadence=run.cadence, name=run.name,
        unsubscribe_url=unsubscribe_url,
        preferences_url=tokens.preferences_url(run.subscriber_id, run.token_version),
    )
    rendered = digest_render.render(ctx)
    html = rewriter_class("digest", run.id).rewrite(
        rendered.html, run.subscriber_id, enabled=settings.tracking and not run.tracking_opt_out)
    return OutgoingMail(
        to=run.email, to_name=run.name, subject=rendered.subject, html=html, text=rendered.text,
        idempotency_key=f"digest-run-{run.id}",
        headers=mail.unsubscribe_headers(unsubscribe_url),
        custom_args={"mail_kind": "digest", "mail_id": str(run.id), "row_id": str(run.id),
                     "subscriber_id": str(run.subscriber_id)},
    )


# -- send + finish ----------------------------------------------------------------------------
def send(provider: Provider, runs: list[ClaimedRun], outcome: Outcome) -> None:
    step = max(1, provider.max_batch)
    for start in range(0, len(runs), step):
        chunk = runs[start:start + step]
        try:
            results = provider.send_batch([r.mail for r in chunk])
        except PermanentError as exc:
            log.error("provider %s refused the batch permanently: %s", provider.name, exc)
            results = [SendResult(ok=False, error=str(exc), permanent=True)] * len(chunk)
        except TransientError as exc:
            log.warning("provider %s failed transiently: %s", provider.name, exc)
            results = [SendResult(ok=False, error=str(exc))] * len(chunk)
        for run, result in zip(chunk, results):
            if result.ok:
                outcome.sent.append((run.id, run.digest.event_ids, result.message_id))
            elif result.permanent:
                outcome.failed.append((run.id, result.error or "permanent provider error"))
            else:
                outcome.retry.append((run.id, result.error or "transient provider error"))


def finish(cur, outcome: Outcome, settings=None) -> None:
    """ONE transaction (the caller commits): mark exactly the loaded events of every sent run, and
    move every run to its final or retry state."""
    settings = settings or config.get()
    if outcome.sent:
        pairs = sorted((eid, run_id) for run_id, ids, _ in outcome.sent for eid in ids)
        # in id order: the update walks the heap and indexes in order instead of jumping around
        event_ids, event_runs = [p[0] for p in pairs], [p[1] for p in pairs]
        # `digest_run_id IS NULL`: an event is never claimed by two sent digests.
        cur.execute("UPDATE digest_events e SET digest_run_id = v.run_id "
                    "FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, run_id) "
                    "WHERE e.id = v.id AND e.digest_run_id IS NULL", (_pg_array(event_ids), _pg_array(event_runs)))
        # 'pending' too: if the watchdog gave up on a slow send that then succeeded, record the
        # success so the run is not sent again.
        cur.execute(
            "UPDATE digest_runs r SET status = 'sent', event_count = v.n, completed_at = now(), "
            "provider_message_id = v.mid, last_error = NULL, next_attempt_at = NULL "
            "FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS v(id, n, mid) "
            "WHERE r.id = v.id AND r.status IN ('processing', 'pending')",
            ([r for r, _, _ in outcome.sent], [len(ids) for _, ids, _ in outcome.sent],
             [mid for _, _, mid in outcome.sent]))
    if outcome.skipped:
        _mark_skipped(cur, outcome.skipped)
    if outcome.retry:
        cur.execute(
            "UPDATE digest_runs r SET attempts = r.attempts + 1, last_error = left(v.err, 2000), "
            "claimed_at = NULL, enqueued_at = NULL, "
            "status = CASE WHEN r.attempts + 1 >= %s THEN 'failed' ELSE 'pending' END, "
            "completed_at = CASE WHEN r.attempts + 1 >= %s THEN now() END, "
            # exponential backoff with jitter, so a provider outage does not end in a stampede
            "next_attempt_at = now() + make_interval(secs => least(%s, %s * power(2, r.attempts)) "
            "                                                * (0.8 + random() * 0.4)) "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(id, err) "
            "WHERE r.id = v.id AND r.status = 'processing'",
            (settings.digest_max_attempts, settings.digest_max_attempts, MAX_BACKOFF_SECONDS,
             settings.digest_retry_base_seconds, [r for r, _ in outcome.retry], [e for _, e in outcome.retry]))
    if outcome.failed:
        cur.execute(
            "UPDATE digest_runs r SET status = 'failed', last_error = left(v.err, 2000), completed_at = now() "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(id, err) WHERE r.id = v.id AND r.status = 'processing'",
            ([r for r, _ in outcome.failed], [e for _, e in outcome.failed]))


def process(run_ids: list[int] | None = None, limit: int | None = None, provider: Provider | None = None) -> dict:
    """Claim up to `limit` runs (the given ids, or any due), send their digests, record the outcome.
    Safe to call concurrently from any number of threads and processes."""
    settings = config.get()
    limit = limit or settings.digest_claim_batch
    if run_ids is not None:
        run_ids = [int(i) for i in run_ids]
        limit = max(limit, len(run_ids))
    started = time.perf_counter()
    conn = connections.get()
    runs: list[ClaimedRun] = []
    try:
        with conn.cursor() as cur:
            runs, skipped = claim(cur, run_ids, limit)
        conn.commit()
        outcome = Outcome()
        if runs:
            try:
                with conn.cursor() as cur:
                    ready = build_digests(cur, runs, settings)
                conn.commit()  # end the read transaction: never hold one open across SMTP
            except psycopg2.Error:
                raise
            except Exception as exc:  # a broken template or a bug: retry later, keep the error
                conn.rollback()
                log.exception("building %d digests failed", len(runs))
                outcome.retry.extend((r.id, f"build failed: {exc!r}") for r in runs)
                ready = []
            else:
                outcome.skipped.extend((r.id, "no events") for r in runs if r.digest is None)
                outcome.retry.extend((r.id, r.error) for r in runs if r.error)
            if ready:
                send(provider or get_provider(), ready, outcome)
            with conn.cursor() as cur:
                finish(cur, outcome, settings)
            conn.commit()
        counts = outcome.counts()
        counts["skipped"] += len(skipped)
        if runs or skipped:
            log.info("digest batch: %s in %.0f ms", counts, (time.perf_counter() - started) * 1e3)
        return counts
    except BaseException:
        connections.reset()
        _release_after_crash([r.id for r in runs])
        raise


def _release_after_crash(run_ids: list[int]) -> None:
    """Best effort after an unexpected error: runs we claimed go back to pending at once instead of
    waiting for the watchdog. Those the provider may have accepted keep the same key on the retry."""
    if not run_ids:
        return
    try:
        with db.raw_cursor() as cur:
            cur.execute("UPDATE digest_runs SET status = 'pending', claimed_at = NULL, enqueued_at = NULL, "
                        "attempts = attempts + 1, last_error = 'worker error, released' "
                        "WHERE id = ANY (%s) AND status = 'processing'", (run_ids,))
    except Exception:
        log.exception("could not release %d claimed runs; the watchdog will", len(run_ids))


def preview(user_id: str, settings=None) -> digest_render.Rendered | None:
    """What the subscriber would receive now: nothing claimed, sent or marked."""
    settings = settings or config.get()
    with db.raw_cursor() as cur:
        cur.execute("SELECT id, email, name, digest_cadence, token_version, tracking_opt_out FROM subscribers "
                    "WHERE user_id = %s", (user_id,))
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"no subscriber with user_id {user_id!r}")
        sid, email, name, cadence, token_version, tracking_opt_out = row
        run = ClaimedRun(0, cadence if cadence != "off" else "daily", 0, sid, user_id, email, name, cadence,
                         token_version, tracking_opt_out, False, False, False)
        events = digest_load.load_unsent(cur, [sid], settings.digest_event_page, settings.digest_max_events)[sid]
        if not events:
            return None
        run.digest = digest_group.build(events, settings.digest_max_items)
        payloads = digest_load.load_payloads(cur, [g.latest_event_id for g in run.digest.groups])
        cur.connection.rollback()
    ctx = digest_context.build(run.digest, payloads, cadence=run.cadence, name=name,
                               unsubscribe_url=tokens.unsubscribe_url(sid, token_version),
                               preferences_url=tokens.preferences_url(sid, token_version))
    return digest_render.render(ctx)
