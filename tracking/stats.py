"""Per-mail statistics with human and machine traffic apart.

mail_stats("newsletter", 42) →
  {"opens":  {"human": n, "machine": n, "unique_human": n, "machine_reasons": {reason: n}},
   "clicks": {"human": n, "machine": n, "unique_human": n, "machine_reasons": {...}},
   "links":  [{"link_id", "url", "human", "machine"}],          # per link, by human clicks
   "events": {"delivered": n, "bounce": n, ...}}               # applied provider webhook events
"unique_human" counts distinct subscribers. The history written in the last
TRACKING_FLUSH_SECONDS may not be visible yet (it is still in the web process buffer).
"""

from __future__ import annotations

from typing import Any

from app.platform import db


def mail_stats(mail_kind: str, mail_id: int) -> dict:
    out: dict[str, Any] = {
        kind: {"human": 0, "machine": 0, "unique_human": 0, "machine_reasons": {}} for kind in ("opens", "clicks")
    }
    key = {"open": "opens", "click": "clicks"}
    for kind, is_machine, total, unique in db.query(
        "SELECT kind, is_machine, count(*), count(DISTINCT subscriber_id) FROM email_link_history "
        "WHERE mail_kind = %s AND mail_id = %s GROUP BY kind, is_machine",
        (mail_kind, mail_id),
    ):
        bucket = out[key[kind]]
        if is_machine:
            bucket["machine"] = total
        else:
            bucket["human"], bucket["unique_human"] = total, unique
    for kind, reason, total in db.query(
        "SELECT kind, machine_reason, count(*) FROM email_link_history WHERE mail_kind = %s "
        "AND mail_id = %s AND is_machine GROUP BY kind, machine_reason",
        (mail_kind, mail_id),
    ):
        out[key[kind]]["machine_reasons"][reason or "unknown"] = total
    out["links"] = [
        {"link_id": lid, "url": url, "human": human, "machine": machine}
        for lid, url, human, machine in db.query(
            "SELECT l.id, l.url, COALESCE(h.human, 0), COALESCE(h.machine, 0) FROM email_links l "
            "LEFT JOIN (SELECT link_id, count(*) FILTER (WHERE NOT is_machine) AS human, "
            "           count(*) FILTER (WHERE is_machine) AS machine FROM email_link_history "
            "           WHERE mail_kind = %s AND mail_id = %s AND kind = 'click' GROUP BY link_id) h "
            "ON h.link_id = l.id WHERE l.mail_kind = %s AND l.mail_id = %s ORDER BY 3 DESC, l.id",
            (mail_kind, mail_id, mail_kind, mail_id),
        )
    ]
    out["events"] = dict(
        db.query(
            "SELECT event, count FROM mail_event_counts WHERE mail_kind = %s AND mail_id = %s ORDER BY event",
            (mail_kind, mail_id),
        )
    )
    return out
