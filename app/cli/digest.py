"""`python -m app digest-now USER_ID… | --all`: make the next digest due now (development: see
digests arrive in the mail viewer without waiting for 9 am); `python -m app preview-digest USER_ID`:
render a subscriber's digest as it would be sent now, without sending or marking anything."""

from __future__ import annotations

import sys
from pathlib import Path

from app.cli import commands
from app.platform import config, db
from digest import build as digest_build
from digest import plan


def cmd_digest_now(args) -> int:
    """make the next digest of some (or all) subscribers due now"""
    db.init()
    if not args.all and not args.user_ids:
        print("error: name USER_IDs or pass --all", file=sys.stderr)
        return 2
    run_ids = plan.send_next_now(None if args.all else args.user_ids)
    batch = max(1, config.get().digest_claim_batch)
    for start in range(0, len(run_ids), batch):
        plan.enqueue(run_ids[start : start + batch])
    print(
        f"{len(run_ids)} digest run(s) made due now and enqueued; a worker sends them "
        "(make run: the mail viewer on port 8025)"
    )
    return 0


def cmd_preview_digest(args) -> int:
    """render a subscriber's digest now; sends and marks nothing"""
    db.init()
    try:
        rendered = digest_build.preview(args.user_id)
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if rendered is None:
        print(f"{args.user_id} has no unsent events: no digest would be sent now", file=sys.stderr)
        return 0
    body = rendered.text if args.text else rendered.html
    if args.output and args.output != "-":
        Path(args.output).write_text(body, encoding="utf-8")
        print(f"subject: {rendered.subject}\nwrote {args.output}", file=sys.stderr)
    else:
        print(f"subject: {rendered.subject}", file=sys.stderr)
        sys.stdout.write(body)
    return 0


def register(sub) -> None:
    p = commands.add(sub, "digest-now", cmd_digest_now)
    p.add_argument("user_ids", nargs="*", metavar="USER_ID")
    p.add_argument("--all", action="store_true", help="every subscriber with unsent events")
    p = commands.add(sub, "preview-digest", cmd_preview_digest)
    p.add_argument("user_id")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--text", action="store_true", help="the plain-text part instead of the HTML")
