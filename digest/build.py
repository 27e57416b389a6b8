"""Build each claimed run's mail: load the batch's unsent events (one statement), then slice by
slice (digest/send.py): group by entity, rank, cap, read the shown entities' titles/links/avatars
(one statement), render subject + HTML, rewrite the slice's links in one round trip, then render the
text part with the same tracked links.

One recipient's problem stays that recipient's: a payload that breaks rendering or link rewriting
fails only that run (retried with backoff, then `failed`), and the rest of the batch is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from app.platform import config, db, mail, tokens
from app.platform.providers.base import OutgoingMail
from app.subscribers import categories, streams
from digest import context as digest_context
from digest import details as digest_details
from digest import load as digest_load
from digest import render as digest_render
from digest import runs as digest_runs
from digest import seen
from digest.claim import ClaimedRun
from tracking.links import LinkRewriter, rewrite_many_with_clicks

log = logging.getLogger("digest.build")


@dataclass
class Batch:
    """A claimed batch's events, read with one statement (two with send-now runs), and what
    building its digests needs besides."""

    registry: dict
    events: dict[int, list]  # subscriber_id -> [Event]
    seen: dict  # subscriber_id -> seen.Marks

    def slices(self, runs: list[ClaimedRun], max_events: int) -> Iterator[list[ClaimedRun]]:
        """Consecutive runs holding at most `max_events` loaded events together (a run with more
        goes alone), each slice's events let go once the next is asked for."""
        part: list[ClaimedRun] = []
        total = 0
        for run in runs:
            n = len(self.events.get(run.subscriber_id) or ())
            if part and total + n > max_events:
                yield part
                self.drop(part)
                part, total = [], 0
            part.append(run)
            total += n
        if part:
            yield part
            self.drop(part)

    def drop(self, runs: list[ClaimedRun]) -> None:
        for run in runs:
            self.events.pop(run.subscriber_id, None)


def load_batch(cur, runs: list[ClaimedRun], settings=None) -> Batch:
    """Every run's events no digest has handled (run.cover: what recording it moves the mark to)
    and the subscribers' seen state."""
    settings = settings or config.get()
    registry = categories.registry(cur)  # cached in process: at most one query per batch
    loaded = digest_load.load(
        cur,
        [r.subscriber_id for r in runs if not (r.urgent_only or r.critical)],
        settings.digest_event_page,
        settings.digest_max_events,
    )
    events = loaded.events
    critical = [r.subscriber_id for r in runs if r.critical]
    if critical:  # critical runs: only the critical events, in a mail of their own
        events.update(
            digest_load.load(
                cur, critical, settings.digest_event_page, settings.digest_max_events, critical_only=True
            ).events
        )
    urgent = [r.subscriber_id for r in runs if r.urgent_only]
    if urgent:  # "send now" runs of digest subscribers: only what cannot wait (a second query)
        events.update(
            digest_load.load(
                cur,
                urgent,
                settings.digest_event_page,
                settings.digest_max_events,
                urgent_categories=categories.send_now_keys(registry),
            ).events
        )
    for run in runs:
        run.cover = None if run.urgent_only or run.critical else loaded.covers.get(run.subscriber_id)
    marks = seen.load(cur, [r.subscriber_id for r in runs])  # what was seen in the app is left out
    return Batch(registry, events, marks)


def build_digests(cur, runs: list[ClaimedRun], settings=None) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Load events and render each run's mail: load_batch, then build_slice of all the runs."""
    settings = settings or config.get()
    return build_slice(cur, runs, load_batch(cur, runs, settings), settings)


def build_slice(
    cur, runs: list[ClaimedRun], batch: Batch, settings=None
) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Group, rank and render the runs' loaded events. Returns (runs with a mail to send,
    [(run_id, error)] for runs whose own data could not be rendered); run.digest is None for runs
    without events, and empty (no groups) for runs with only the subscriber's own activity.
    A broken template (TemplateError) raises: every run would fail the same way."""
    settings = settings or config.get()
    registry = batch.registry
    for run in runs:
        evs = batch.events.get(run.subscriber_id) or []
        run.digest = (
            seen.build_digest(evs, batch.seen.get(run.subscriber_id), settings.digest_max_items, run.user_id)
            if evs
            else None
        )
    digest_details.resolve(cur, [r.digest for r in runs if r.digest and not r.digest.empty])
    now = datetime.now(UTC)
    rendered, errors = [], []
    for run in runs:
        if run.digest is None or run.digest.empty:
            continue
        try:
            rendered.append((run, render_mail(run, registry, now)))
        except digest_render.TemplateError:
            raise
        except Exception as exc:
            log.exception("rendering digest run %s failed", run.id)
            errors.append((run.id, f"render failed: {exc!r}"))
    # Every run's links in one round trip (one email_links statement per slice, not per run).
    tracked = rewrite_many_with_clicks(
        "digest",
        [
            (LinkRewriter("digest", run.id), html, run.subscriber_id, settings.tracking and not run.tracking_opt_out)
            for run, (_, html, _) in rendered
        ],
    )
    ready = []
    for (run, (subject, _, ctx)), (html, clicks) in zip(rendered, tracked):
        try:
            run.mail = outgoing_mail(run, subject, html, render_text(ctx, clicks), ctx["unsubscribe_url"])
            ready.append(run)
        except digest_render.TemplateError:
            raise
        except Exception as exc:
            log.exception("rendering digest run %s failed", run.id)
            errors.append((run.id, f"render failed: {exc!r}"))
    return ready, errors


def render_mail(run: ClaimedRun, registry: dict, now: datetime) -> tuple[str, str, dict]:
    """(subject, HTML before link tracking, context) of one run's digest."""
    return digest_render.templates().render_html(context_for(run, registry, now))


def context_for(run: ClaimedRun, registry: dict, now: datetime) -> dict:
    if run.digest is None:
        raise ValueError(f"run {run.id}: loaded and grouped before its context is built")
    return digest_context.build(
        run.digest,
        digest_context.Reader(
            name=run.name,
            cadence="immediately" if run.critical else run.cadence,  # worded as any mail sent as it happens
            timezone=run.timezone,
            last_digest_at=run.last_digest_at,
            unsubscribe_url=unsubscribe_url(run.subscriber_id, run.token_version),
            preferences_url=tokens.preferences_url(run.subscriber_id, run.token_version),
            view_url=tokens.view_url(run.subscriber_id, run.token_version, run.id),
            locale=run.locale,
            held=run.held,
        ),
        categories=registry,
        now=now,
    )


def unsubscribe_url(subscriber_id: int, token_version: int) -> str:
    """The digest stream's link: a one-click unsubscribe stops digests, not newsletters."""
    return tokens.unsubscribe_url(subscriber_id, token_version, streams.DIGEST_MAIL_SCOPE)


def render_text(ctx: dict, clicks: dict[str, str]) -> str:
    """The plain-text part, with the same click-tracking links as the HTML part when tracked."""
    if clicks:
        ctx = {
            **ctx,
            "groups": [{**g, "url": clicks.get(g["url"], g["url"])} if g["has_url"] else g for g in ctx["groups"]],
        }
    return digest_render.templates().render_text(ctx)


def outgoing_mail(run: ClaimedRun, subject: str, html: str, text: str, unsubscribe: str | None = None) -> OutgoingMail:
    """`unsubscribe`: the run's unsubscribe URL when the caller has it already (the context's)."""
    return OutgoingMail(
        to=run.email,
        to_name=run.name,
        subject=mail.one_line(subject),
        html=html,
        text=text,
        idempotency_key=f"digest-run-{run.id}",
        headers=mail.unsubscribe_headers(unsubscribe or unsubscribe_url(run.subscriber_id, run.token_version)),
        provider=run.provider,
        custom_args={
            "mail_kind": "digest",
            "mail_id": str(run.id),
            "row_id": str(run.id),
            "subscriber_id": str(run.subscriber_id),
        },
    )


def preview(user_id: str, settings=None) -> digest_render.Rendered | None:
    """What the subscriber would receive now (links untracked): nothing claimed, sent or marked."""
    settings = settings or config.get()
    with db.raw_cursor() as cur:
        cur.execute(
            "SELECT s.id, s.email, s.name, s.digest_cadence, s.token_version, s.timezone, "
            f"{digest_runs.LAST_SENT_AT}, s.locale FROM subscribers s WHERE s.user_id = %s",
            (user_id,),
        )
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"no subscriber with user_id {user_id!r}")
        sid, _email, name, cadence, token_version, tz, last_digest_at, locale = row
        events = digest_load.load_unsent(cur, [sid], settings.digest_event_page, settings.digest_max_events)[sid]
        digest = seen.build_digest(events, seen.load(cur, [sid]).get(sid), settings.digest_max_items, user_id)
        if digest.empty:
            return None
        digest_details.resolve(cur, [digest])
        registry = categories.registry(cur)
    cadence = cadence if cadence != "off" else "daily"
    ctx = digest_context.build(
        digest,
        digest_context.Reader(
            name=name,
            cadence=cadence,
            timezone=tz,
            last_digest_at=last_digest_at,
            unsubscribe_url=unsubscribe_url(sid, token_version),
            preferences_url=tokens.preferences_url(sid, token_version),
            locale=locale,
        ),
        categories=registry,
        now=datetime.now(UTC),
    )
    return digest_render.render(ctx)
