"""Seven days of mail history so the operator dashboard (/admin) has something to show in
`make run`: sent digests with their lateness, three newsletters (two done, one paused part-way),
opens and clicks (some by machines), bounces and complaints with their suppressions.

Development only (scripts/demo_data.py calls it). Every run first deletes the previous history —
all of it is recognisable: subscribers `demo-history-*` at @history.example.test, newsletters whose
subject starts with "[demo]", webhook events `demo-history-*` — and writes it again relative to
now, in one transaction. The history subscribers have digests off, so nothing is ever sent to them.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg2.extras

from app.platform import db

USERS = 300
DAYS = 7
PREFIX = "demo-history-"
DOMAIN = "history.example.test"
SUBJECT_MARK = "[demo] "
NEWSLETTERS = (  # subject, sent how long ago, share of the outbox sent (the rest waits: paused)
    ("Spring product update", timedelta(days=5, hours=3), 1.0),
    ("Five tips for your week", timedelta(days=2, hours=7), 1.0),
    ("Summer sale preview", timedelta(hours=5), 0.6),
)
# UTC hours people chose for their digest, weighted towards mornings and evenings.
HOURS = [h for h in range(24) for _ in range({7: 6, 8: 8, 9: 5, 12: 3, 17: 4, 18: 5, 19: 3}.get(h, 1))]


def _forget(cur) -> None:
    like = PREFIX + "%"
    cur.execute(
        "DELETE FROM email_link_history WHERE subscriber_id IN (SELECT id FROM subscribers WHERE user_id LIKE %s)",
        (like,),
    )
    cur.execute(
        "DELETE FROM email_links WHERE (mail_kind = 'digest' AND mail_id IN (SELECT r.id FROM digest_runs r "
        "JOIN subscribers s ON s.id = r.subscriber_id WHERE s.user_id LIKE %s)) OR (mail_kind = 'newsletter' "
        "AND mail_id IN (SELECT id FROM newsletters WHERE subject LIKE %s))",
        (like, SUBJECT_MARK + "%"),
    )
    cur.execute("DELETE FROM webhook_events WHERE sg_event_id LIKE %s", (like,))
    cur.execute("DELETE FROM suppressions WHERE email LIKE %s", ("%@" + DOMAIN,))
    cur.execute("DELETE FROM newsletters WHERE subject LIKE %s", (SUBJECT_MARK + "%",))
    cur.execute("DELETE FROM subscribers WHERE user_id LIKE %s", (like,))


def _values(cur, sql: str, rows: list, fetch: bool = False):
    return psycopg2.extras.execute_values(cur, sql, rows, page_size=1000, fetch=fetch) if rows else []


def load(now: datetime | None = None, seed: int = 11) -> dict:
    now = now or datetime.now(UTC)
    rng = random.Random(seed)
    mails = []  # (mail_kind, mail_id, subscriber_id, email, sent_at)
    with db.raw_cursor() as cur:
        _forget(cur)
        people = _values(
            cur,
            "INSERT INTO subscribers (user_id, email, name, digest_cadence) VALUES %s RETURNING id, email",
            [(f"{PREFIX}{i:03d}", f"reader{i:03d}@{DOMAIN}", f"Reader {i}", "off") for i in range(USERS)],
            fetch=True,
        )

        runs = []
        for sid, _email in people:
            hour, minute = rng.choice(HOURS), rng.randrange(60)
            for day in range(DAYS, -1, -1):
                slot = (now - timedelta(days=day)).replace(hour=hour, minute=minute, second=0, microsecond=0)
                late = rng.uniform(2, 90) if rng.random() < 0.97 else rng.uniform(300, 1800)
                sent_at = slot + timedelta(seconds=late)
                if sent_at < now - timedelta(days=DAYS) or sent_at > now:
                    continue
                runs.append(
                    (
                        sid,
                        "daily",
                        slot.date(),
                        slot,
                        "sent",
                        1,
                        sent_at - timedelta(seconds=1),
                        sent_at,
                        rng.randint(1, 12),
                    )
                )
        for run_id, sid, sent_at in _values(
            cur,
            "INSERT INTO digest_runs (subscriber_id, cadence, period, scheduled_for, status, attempts, "
            "claimed_at, completed_at, event_count) VALUES %s RETURNING id, subscriber_id, completed_at",
            runs,
            fetch=True,
        ):
            mails.append(("digest", run_id, sid, None, sent_at))

        for subject, ago, share in NEWSLETTERS:
            started = now - ago
            done = share >= 1.0
            ((nid,),) = _values(
                cur,
                "INSERT INTO newsletters (subject, html, status, audience, send_requested_at, started_at, "
                "outbox_completed_at, completed_at) VALUES %s RETURNING id",
                [
                    (
                        SUBJECT_MARK + subject,
                        "<p>Hello {{name}}</p>",
                        "done" if done else "paused",
                        '{"kind": "all"}',
                        started,
                        started,
                        started,
                        started + timedelta(minutes=40) if done else None,
                    )
                ],
                fetch=True,
            )
            rows = []
            for i, (sid, email) in enumerate(people):
                if i < len(people) * share:
                    rows.append((nid, sid, email, "sent", 1, started + timedelta(seconds=8 * i)))
                else:
                    rows.append((nid, sid, email, "pending", 0, None))
            for sid, email, sent_at in _values(
                cur,
                "INSERT INTO email_log (newsletter_id, subscriber_id, email, status, attempts, sent_at) "
                "VALUES %s RETURNING subscriber_id, email, sent_at",
                rows,
                fetch=True,
            ):
                if sent_at is not None:
                    mails.append(("newsletter", nid, sid, email, sent_at))

        emails = dict(people)
        links, hits, events, suppressed = {}, [], [], {}
        for kind, mail_id, sid, _email, sent_at in mails:
            if rng.random() < 0.06:  # Apple Mail Privacy Protection fetches the pixel at once
                hits.append(("open", None, kind, mail_id, sid, True, "apple_mpp", sent_at + timedelta(seconds=2)))
            if rng.random() < (0.42 if kind == "digest" else 0.33):
                opened = sent_at + timedelta(minutes=rng.expovariate(1 / 150))
                if opened <= now:
                    hits.append(("open", None, kind, mail_id, sid, False, None, opened))
                    if rng.random() < 0.27 and opened + timedelta(seconds=40) <= now:
                        links.setdefault((kind, mail_id), None)
                        hits.append(
                            ("click", (kind, mail_id), kind, mail_id, sid, False, None, opened + timedelta(seconds=40))
                        )
            address = emails[sid]
            if rng.random() < 0.012 and address not in suppressed and sent_at + timedelta(minutes=1) <= now:
                bounce_type = "blocked" if rng.random() < 0.3 else "bounce"
                events.append(("bounce", address, {"type": bounce_type}, sent_at + timedelta(minutes=1)))
                suppressed[address] = (
                    "block" if bounce_type == "blocked" else "bounce",
                    sent_at + timedelta(minutes=1),
                )
            elif rng.random() < 0.003 and address not in suppressed and sent_at + timedelta(hours=3) <= now:
                events.append(("spamreport", address, {}, sent_at + timedelta(hours=3)))
                suppressed[address] = ("spamreport", sent_at + timedelta(hours=3))

        for key, link_id in zip(
            links,
            [
                row[0]
                for row in _values(
                    cur,
                    "INSERT INTO email_links (mail_kind, mail_id, url, url_hash) VALUES %s RETURNING id",
                    [(k, m, "https://example.test/demo", psycopg2.Binary(b"demo-history-link")) for k, m in links],
                    fetch=True,
                )
            ],
        ):
            links[key] = link_id
        _values(
            cur,
            "INSERT INTO email_link_history (kind, link_id, mail_kind, mail_id, subscriber_id, is_machine, "
            "machine_reason, occurred_at) VALUES %s",
            [(kind, links[link] if link else None, *rest) for kind, link, *rest in hits],
        )
        _values(
            cur,
            "INSERT INTO webhook_events (sg_event_id, event, email, payload, received_at, processed_at) VALUES %s",
            [
                (
                    f"{PREFIX}{i}",
                    event,
                    address,
                    psycopg2.extras.Json({"event": event, "email": address, **extra}),
                    at,
                    at,
                )
                for i, (event, address, extra, at) in enumerate(events)
            ],
        )
        _values(
            cur,
            "INSERT INTO suppressions (email, reason, source, created_at) VALUES %s ON CONFLICT DO NOTHING",
            [
                (address, reason, f"sendgrid:{'bounce' if reason == 'block' else reason}", at)
                # in time order, as they would have arrived: the list shows the newest first by id
                for address, (reason, at) in sorted(suppressed.items(), key=lambda item: item[1][1])
            ],
        )
    return {"mails": len(mails), "opens_clicks": len(hits), "bounces_complaints": len(events)}
