"""`python -m app newsletter-status ID`: a live progress bar until the newsletter is finished."""

from __future__ import annotations

import sys
import time
from datetime import datetime

from app.cli import commands
from app.newsletter import service
from app.platform import db
from app.platform.validation import as_json

FINAL = ("done", "cancelled")
BAR_WIDTH = 40


def progress_line(s: service.NewsletterStatus, rate: float | None = None) -> str:
    c = _counts(s)
    finished = c["sent"] + c["failed"] + c["suppressed"] + c["cancelled"]
    fraction = finished / c["total"] if c["total"] else (1.0 if s.status == "done" else 0.0)
    filled = int(BAR_WIDTH * fraction)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    extra = f"  {rate:,.0f}/s" if rate else ""
    if s.status == "draft":
        return f"[{'-' * BAR_WIDTH}]   0.0%  draft: not sent yet (waiting for POST /v1/newsletters/{s.id}/send)"
    local = f", each recipient at {s.local_time} their time" if s.local_time else ""
    if s.status == "scheduled":
        return f"[{'-' * BAR_WIDTH}]   0.0%  scheduled: starts {_when(s.send_at)}{local}"
    outbox = "" if s.outbox_completed_at or s.status in FINAL else " (outbox building)"
    return (
        f"[{bar}] {fraction * 100:5.1f}%  {s.status}{outbox}  sent {c['sent']:,}  failed {c['failed']:,}  "
        f"suppressed {c['suppressed']:,}  pending {c['pending']:,}  sending {c['sending']:,}  "
        f"of {c['total']:,}{extra}{local}"
    )


def _counts(s: service.NewsletterStatus) -> dict[str, int]:
    """One count per row status, and the total (RowCounts' fields come from the statuses)."""
    return as_json(s)["counts"]


def _when(at: datetime | None) -> str:
    return at.isoformat() if at else "?"


def cmd_status(args) -> int:
    """progress of a newsletter send (live bar until done)"""
    db.init()
    try:
        s = service.newsletter_status(args.id)
    except service.NotFound:
        print(f"no newsletter {args.id}", file=sys.stderr)
        return 1
    tty = sys.stdout.isatty() and not args.once
    last_sent, last_t = _counts(s)["sent"], time.monotonic()
    rate = None
    while True:
        line = progress_line(s, rate=rate)
        if args.once or s.status in FINAL:
            print(("\r" if tty else "") + line)
            break
        print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
        time.sleep(args.interval)
        s = service.newsletter_status(args.id)
        now = time.monotonic()
        sent = _counts(s)["sent"]
        rate = (sent - last_sent) / max(1e-6, now - last_t)
        last_sent, last_t = sent, now
    print(
        f"opens {s.opens.human:,} human / {s.opens.machine:,} machine, clicks "
        f"{s.clicks.human:,} human / {s.clicks.machine:,} machine, bounces {s.bounces:,}, "
        f"unsubscribes {s.unsubscribes:,}"
    )
    return 0


def register(sub) -> None:
    p = commands.add(sub, "newsletter-status", cmd_status)
    p.add_argument("id", type=int)
    p.add_argument("--once", action="store_true", help="print the current state once and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
