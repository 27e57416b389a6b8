"""Build each claimed run's mail: load its unsent events, group, rank, cap, render, rewrite links.

One recipient's problem stays that recipient's: a payload that breaks rendering or link rewriting
fails only that run (retried with backoff, then `failed`), and the rest of the batch is sent.
"""
from __future__ import annotations

import logging

from app import config, db, mail, tokens
from app.providers.base import OutgoingMail
from digest import context as digest_context
from digest import group as digest_group
from digest import load as digest_load
from digest import render as digest_render
from digest.claim import ClaimedRun
from tracking.links import LinkRewriter, rewrite_many

log = logging.getLogger("digest.build")


def build_digests(cur, runs: list[ClaimedRun], settings=None) -> tuple[list[ClaimedRun], list[tuple[int, str]]]:
    """Load events and render each run's mail. Returns (runs with a mail to send, [(run_id, error)]
    for runs whose own data could not be rendered); run.digest is None for the empty ones.
    A broken template (TemplateError) raises: every run would fail the same way."""
    settings = settings or config.get()
    events = digest_load.load_unsent(cur, [r.subscriber_id for r in runs], settings.digest_event_page,
                                     settings.digest_max_events)
    for run in runs:
        evs = events.get(run.subscriber_id) or []
        run.digest = digest_group.build(evs, settings.digest_max_items) if evs else None
    shown = [g.latest_event_id for r in runs if r.digest for g in r.digest.groups]
    payloads = digest_load.load_payloads(cur, shown)
    rendered, errors = [], []
    for run in runs:
        if run.digest is None:
            continue
        try:
            rendered.append((run, render_mail(run, payloads)))
        except digest_render.TemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 - one odd subscriber or payload must not hold up the batch
            log.exception("rendering digest run %s failed", run.id)
            errors.append((run.id, f"render failed: {exc!r}"))
    # Every run's links in one round trip (one email_links statement per batch, not per run).
    htmls = rewrite_many("digest", [(LinkRewriter("digest", run.id), r.html, run.subscriber_id,
                                     settings.tracking and not run.tracking_opt_out) for run, r in rendered])
    for (run, r), html in zip(rendered, htmls):
        run.mail = outgoing_mail(run, r, html)
    return [run for run, _ in rendered], errors


def render_mail(run: ClaimedRun, payloads: dict) -> digest_render.Rendered:
    ctx = digest_context.build(
        run.digest, payloads, cadence=run.cadence, name=run.name,
        unsubscribe_url=tokens.unsubscribe_url(run.subscriber_id, run.token_version),
        preferences_url=tokens.preferences_url(run.subscriber_id, run.token_version),
    )
    return digest_render.render(ctx)


def outgoing_mail(run: ClaimedRun, rendered: digest_render.Rendered, html: str) -> OutgoingMail:
    return OutgoingMail(
        to=run.email, to_name=run.name, subject=mail.one_line(rendered.subject), html=html, text=rendered.text,
        idempotency_key=f"digest-run-{run.id}",
        headers=mail.unsubscribe_headers(tokens.unsubscribe_url(run.subscriber_id, run.token_version)),
        custom_args={"mail_kind": "digest", "mail_id": str(run.id), "row_id": str(run.id),
                     "subscriber_id": str(run.subscriber_id)},
    )


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
        events = digest_load.load_unsent(cur, [sid], settings.digest_event_page, settings.digest_max_events)[sid]
        if not events:
            return None
        digest = digest_group.build(events, settings.digest_max_items)
        payloads = digest_load.load_payloads(cur, [g.latest_event_id for g in digest.groups])
    ctx = digest_context.build(digest, payloads, cadence=cadence if cadence != "off" else "daily", name=name,
                               unsubscribe_url=tokens.unsubscribe_url(sid, token_version),
                               preferences_url=tokens.preferences_url(sid, token_version))
    return digest_render.render(ctx)
