"""`python -m app stop-sending --reason …` and `python -m app resume-sending`: the emergency stop
for all outgoing mail (app/platform/mail_stop.py), from a shell."""

from __future__ import annotations

import getpass

from app.cli.output import print_json
from app.newsletter import kick
from app.platform import db, mail_stop
from digest import plan


def _operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def cmd_stop(args) -> int:
    db.init()
    print_json(mail_stop.engage(_operator(), args.reason))
    return 0


def cmd_resume(args) -> int:
    db.init()
    was_stopped = mail_stop.release(_operator())
    print_json(
        {
            "stopped": False,
            "was_stopped": was_stopped,
            "digest_runs_requeued": plan.forget_enqueued(),
            "newsletters_restarted": kick.restart_sending(),
        }
    )
    return 0


def cmd_status(args) -> int:
    db.init()
    print_json({"stopped": mail_stop.state() is not None, **(mail_stop.state() or {})})
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "stop-sending",
        help="EMERGENCY STOP: every digest and newsletter sender stops within a second, until resume-sending",
    )
    p.add_argument("--reason", default="", help="shown on the dashboard and in the logs")
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser(
        "resume-sending",
        help="release the emergency stop: due digests and paused-by-stop "
        "newsletters continue, nothing lost or sent twice",
    )
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser("sending-status", help="whether the emergency stop is engaged, since when, by whom, why")
    p.set_defaults(func=cmd_status)
