"""The naive digest sender the benchmark compares against (worker module: `dramatiq scripts.bench.digest_naive`).

What a first version would do: one Dramatiq task per subscriber, premailer on every mail, chevron on
the template string every time, the standard library's EmailMessage, and a new SMTP connection per
mail. It shares the digest logic (load, group, rank) and the database access with the real sender,
so the difference measured is the sending architecture.
"""

from __future__ import annotations

import smtplib
from datetime import UTC, datetime
from email.message import EmailMessage
from email.policy import SMTP
from urllib.parse import urlparse

import chevron
import dramatiq

import actors  # noqa: F401  (broker first, then this module's actor binds to it)
from app.platform import config, db, mail, tokens
from app.platform.css_inline import inline_css
from app.subscribers import categories
from digest import claim as digest_claim
from digest import context as digest_context
from digest import details as digest_details
from digest import group as digest_group
from digest import load as digest_load
from digest import render as digest_render


def _naive_render(ctx: dict) -> tuple[str, str, str]:
    directory = digest_render.template_dir()
    html_src = (directory / "digest.html").read_text()
    subject = " ".join(chevron.render((directory / "subject.txt").read_text(), ctx).split())
    ctx = {**ctx, "subject": subject}
    html = chevron.render(inline_css(html_src, strip_important=False), ctx)  # premailer per mail
    text = chevron.render((directory / "digest.txt").read_text(), ctx)
    return subject, html, text


@dramatiq.actor(queue_name="digest_naive", max_retries=0)
def naive_send_digest(run_id: int) -> None:
    settings = config.get()
    conn = db.thread_connection.get()
    with db.transaction(conn) as cur:
        runs, _ = digest_claim.claim(cur, [run_id], 1, settings.digest_max_attempts)
    if not runs:
        return
    run = runs[0]
    with db.transaction(conn) as cur:
        events = digest_load.load_unsent(cur, [run.subscriber_id])[run.subscriber_id]
        digest = digest_group.build(events, settings.digest_max_items, recipient=run.user_id)
        digest_details.resolve(cur, [digest])
        registry = categories.registry(cur)
    unsubscribe_url = tokens.unsubscribe_url(run.subscriber_id, run.token_version)
    ctx = digest_context.build(
        digest,
        digest_context.Reader(
            name=run.name,
            cadence=run.cadence,
            timezone=run.timezone,
            last_digest_at=run.last_digest_at,
            unsubscribe_url=unsubscribe_url,
            preferences_url=tokens.preferences_url(run.subscriber_id, run.token_version),
        ),
        categories=registry,
        now=datetime.now(UTC),
    )
    subject, html, text = _naive_render(ctx)
    msg = EmailMessage(policy=SMTP)
    msg["From"], msg["To"], msg["Subject"] = settings.mail_from, run.email, subject
    msg["Message-ID"] = mail.message_id(f"digest-run-{run.id}")
    for name, value in mail.unsubscribe_headers(unsubscribe_url).items():
        msg[name] = value
    msg.set_content(text)
    msg.add_alternative(html, subtype="html")
    url = urlparse(settings.smtp_url)
    with smtplib.SMTP(url.hostname, url.port, timeout=30) as smtp:  # new connection per mail
        smtp.send_message(msg)
    with db.transaction(conn) as cur:
        cur.execute(
            "UPDATE digest_events SET digest_run_id = %s WHERE id = ANY (%s) AND digest_run_id IS NULL",
            (run.id, digest.event_ids),
        )
        cur.execute(
            "UPDATE digest_runs SET status = 'sent', event_count = %s, completed_at = now() WHERE id = %s",
            (len(digest.event_ids), run.id),
        )
