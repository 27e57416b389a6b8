"""The one owner of `webhook_events`: every statement that writes it.

Rows are stored by the intake (tracking/webhook_intake.py: INSERT_SQL, each provider event id once),
claimed and marked applied by the apply step (tracking/webhook_apply.py), dropped once applied when
their address was erased, and deleted with a subscriber (`erase`). The canonical-form backfill of
migration 0601 is app/subscribers/rekey.py's.
"""

from __future__ import annotations

from typing import Any

from app.platform import db

INSERT_SQL = (
    "INSERT INTO webhook_events (sg_event_id, event, email, payload, canonical_email) VALUES %s "
    "RETURNING id, sg_event_id"
)
INSERT_TEMPLATE = "(%s, %s, %s, %s::jsonb, %s)"


def claim(cur: db.Cursor, ids: list[int]) -> list[tuple[Any, ...]]:
    """The rows among `ids` not applied yet, locked for this transaction (another worker skips them):
    (id, event, email, payload, canonical_email, sg_event_id), in id order."""
    cur.execute(
        "SELECT id, event, email, payload, canonical_email, sg_event_id FROM webhook_events WHERE id = ANY(%s) "
        "AND processed_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED",
        (ids,),
    )
    return cur.fetchall()


def mark_applied(cur: db.Cursor, ids: list[int], errors: dict[int, str]) -> None:
    """Applied, in the transaction of their effects; `errors`: why an event had none."""
    cur.execute(
        "UPDATE webhook_events SET processed_at = now(), error = (%s::jsonb ->> id::text) WHERE id = ANY(%s)",
        (db.json({str(k): v for k, v in errors.items()}), ids),
    )


def key_unkeyed(cur: db.Cursor, keys: list[tuple[int, str]]) -> None:
    """Events stored without their canonical address (by a web process of the previous release,
    during a deploy) get it, so that an erasure finds them."""
    if keys:
        cur.execute(
            "UPDATE webhook_events w SET canonical_email = v.key FROM unnest(%s::bigint[], %s::text[]) "
            "AS v(id, key) WHERE w.id = v.id AND w.canonical_email IS NULL",
            ([i for i, _ in keys], [k for _, k in keys]),
        )


def forget_erased(cur: db.Cursor, ids: list[int]) -> None:
    """The providers keep reporting on mail sent before an erasure (opens, clicks, weeks later). Once
    applied, such an event is not kept: the suppressions row is all we keep of an erased address."""
    cur.execute(
        "DELETE FROM webhook_events w USING suppressions s WHERE w.id = ANY(%s) "
        "AND s.email = w.canonical_email AND s.reason = 'erased'",
        (ids,),
    )


def erase(cur: db.Cursor, addresses: list[str], subscriber_id: int) -> None:
    """Right to erasure: the raw events carry the address (every canonical address the subscriber was
    mailed at), and our custom_args carry the subscriber id."""
    cur.execute(
        "DELETE FROM webhook_events WHERE canonical_email = ANY(%s) OR payload ->> 'subscriber_id' = %s",
        (addresses, str(subscriber_id)),
    )


def unprocessed(older_than_seconds: float, limit: int) -> list[int]:
    """Ids of stored events still not applied this long after they arrived (Redis lost the hint)."""
    rows = db.query(
        "SELECT id FROM webhook_events WHERE processed_at IS NULL "
        "AND received_at < now() - make_interval(secs => %s) ORDER BY id LIMIT %s",
        (older_than_seconds, limit),
    )
    return [r[0] for r in rows]
