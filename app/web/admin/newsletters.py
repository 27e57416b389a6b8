"""The dashboard's newsletter table: newest first, with send progress from the outbox (email_log).

One page is PAGE_SIZE newsletters and two statements: the page, then the outbox counts of exactly
those newsletters by status and variant (email_log_once's index on newsletter_id). Counting a very
large newsletter's rows costs a scan of its index entries, which is why a page is small. A
newsletter in several languages also shows each variant's recipients, sent, and the people who
opened and clicked (app/newsletter/service.py `variant_counts`, as GET /v1/newsletters/{id}: one
more statement per such newsletter, on its tracking history).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import chevron

from app.newsletter import service
from app.platform import db, greeting

PAGE_SIZE = 20
MAX_PAGE = 500
DONE_STATES = ("sent", "failed", "suppressed", "cancelled")
# Whom the table shows a subject template for: "What's new, {{name}}" reads "What's new, Ana Lima".
SAMPLE_NAME = "Ana Lima"
SAMPLE = {
    "name": SAMPLE_NAME,
    "greeting": greeting.greeting(SAMPLE_NAME),
    "email": "ana@example.com",
    "user_id": "sample-user",
    "unsubscribe_url": "",
    "preferences_url": "",
}


def sample_subject(subject: str) -> str:
    """The subject as the sample reader gets it; as written if it does not render (it was checked on
    create, so only a template from before a grammar change could fail)."""
    try:
        return " ".join(chevron.render(subject, SAMPLE).split())
    except Exception:
        return subject


@dataclass(frozen=True)
class Row:
    id: int
    subject: str
    status: str
    created_at: object
    send_requested_at: object
    completed_at: object
    send_at: object  # what a scheduled newsletter is (or was) scheduled for
    started_at: object  # when its send started (None: not yet)
    local_time: object  # each recipient's wall-clock time, in their own zone
    counts: dict  # email_log status -> rows
    # Per variant (the default first, then by tag): service.VariantCounts; [] without variants.
    variants: list = field(default_factory=list)

    sample_name = SAMPLE_NAME  # a plain class attribute, not a field

    @property
    def sample_subject(self) -> str:
        return sample_subject(self.subject)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(self.counts.get(s, 0) for s in DONE_STATES)

    @property
    def waiting(self) -> int:
        return self.counts.get("pending", 0) + self.counts.get("sending", 0)

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 0


def page(number: int, size: int = PAGE_SIZE) -> tuple[list[Row], bool]:
    """Newsletters of page `number` (1-based) and whether a next page exists."""
    found = db.query(
        "SELECT id, subject, status, created_at, send_requested_at, completed_at, send_at, started_at, local_time, "
        "ARRAY(SELECT k FROM jsonb_object_keys(coalesce(variants, '{}'::jsonb)) k ORDER BY k) "
        "FROM newsletters "
        "ORDER BY id DESC LIMIT %s OFFSET %s",
        (size + 1, (number - 1) * size),
    )
    has_next = len(found) > size
    found = found[:size]
    counts: dict[int, dict] = {row[0]: {} for row in found}
    by_variant: dict[int, list[tuple]] = {row[0]: [] for row in found}
    if counts:
        for newsletter_id, status, variant, n in db.query(
            "SELECT newsletter_id, status, variant, count(*) FROM email_log WHERE newsletter_id = ANY(%s) "
            "GROUP BY 1, 2, 3",
            (list(counts),),
        ):
            counts[newsletter_id][status] = counts[newsletter_id].get(status, 0) + n
            by_variant[newsletter_id].append((status, variant, n))
    rows = []
    for *shown, tags in found:
        nid = shown[0]
        per_variant = service.variant_counts(nid, list(tags), by_variant[nid]) if tags else []
        # A row of the SELECT above holds every field but counts (mypy cannot count a row).
        rows.append(Row(*shown, counts[nid], per_variant))  # type: ignore[call-arg]
    return rows, has_next
