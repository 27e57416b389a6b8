"""A sent digest's hosted copy ("View in your browser", GET /v/{token}).

Re-rendered on request from the events the run handled (digest/marks.py), the
way the worker rendered it: nothing is stored per mail, and the digest path pays only for signing
one more token per mail. The copy is the mail as sent — relative times and "since Tuesday" are
worded from the send time — with direct links (no click tracking, no open pixel) and no "view in
your browser" line of its own. What was seen in the app before the send is left out, as it was
from the mail (digest/seen.py, as_of). Titles, links and avatars come from the same events, so a later
event of the entity does not change an old copy.

Once retention dropped the run's events (RETENTION_DAYS), the copy is gone: `Gone` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.platform import config, db, tokens
from app.subscribers import categories
from digest import build as digest_build
from digest import context as digest_context
from digest import details as digest_details
from digest import group as digest_group
from digest import marks, seen
from digest import render as digest_render

# The run must be this subscriber's and sent; the previous sent digest words "since …".
_RUN_SQL = """
SELECT CASE WHEN r.cadence = 'critical' THEN 'immediately' ELSE r.cadence END, r.completed_at,
       (SELECT max(p.completed_at) FROM digest_runs p
         WHERE p.subscriber_id = r.subscriber_id AND p.status = 'sent' AND p.completed_at < r.completed_at)
FROM digest_runs r
WHERE r.id = %s AND r.subscriber_id = %s AND r.status = 'sent'
"""
# The events the run handled (digest/marks.py), minus the topics the subscriber has opted out of:
# a run's cover includes the events of opted-out topics it never read.
_EVENTS_SQL = (
    "SELECT * FROM ("
    + marks.run_events_sql(
        "e.id, e.category, e.entity_type, e.entity_id, e.actor_id, e.actor_name, e.occurred_at, e.high_priority"
    )
    + ") e WHERE NOT (e.category = ANY (%(opt_outs)s::text[])) ORDER BY e.id LIMIT %(limit)s"
)


@dataclass(frozen=True)
class Copy:
    subject: str
    html: str
    sent_at: datetime


@dataclass(frozen=True)
class Gone:
    sent_at: datetime


def render(run_id: int, subscriber: dict) -> Copy | Gone | None:
    """The copy of run `run_id` for `subscriber` (a row of app/web/pages/subscription.py), Gone when its events
    were dropped, None when there is no such sent run of theirs."""
    settings = config.get()
    with db.raw_cursor() as cur:
        cur.execute(_RUN_SQL, (run_id, subscriber["id"]))
        row = cur.fetchone()
        if row is None:
            return None
        cadence, sent_at, previous_at = row
        cur.execute(
            _EVENTS_SQL,
            {
                "run": run_id,
                "opt_outs": list(subscriber.get("category_opt_outs") or []),
                "limit": settings.digest_max_events,
            },
        )
        events = [digest_group.Event._make(r) for r in cur.fetchall()]
        # Seen in the app before the send: handled by the run, not shown in it.
        seen_state = seen.as_of(seen.load(cur, [subscriber["id"]]).get(subscriber["id"]), sent_at)
        digest = (
            seen.build_digest(events, seen_state, settings.digest_max_items, subscriber["user_id"]) if events else None
        )
        if digest is None or digest.empty:
            return Gone(sent_at)
        digest_details.resolve(cur, [digest])
        registry = categories.registry(cur)
    sid, version = subscriber["id"], subscriber["token_version"]
    ctx = digest_context.build(
        digest,
        digest_context.Reader(
            name=subscriber["name"],
            cadence=cadence,
            timezone=subscriber["timezone"],
            locale=subscriber.get("locale"),
            last_digest_at=previous_at,
            unsubscribe_url=digest_build.unsubscribe_url(sid, version),
            preferences_url=tokens.preferences_url(sid, version),
        ),
        categories=registry,
        now=sent_at,
    )
    subject, html, _ = digest_render.templates().render_html(ctx)
    return Copy(subject, html, sent_at)
