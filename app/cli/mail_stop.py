"""`python -m app stop-sending --reason …` and `python -m app resume-sending`: the emergency stop
for all outgoing mail (app/operations/sending.py, audited under the login name), from a shell."""

from __future__ import annotations

from app.cli.output import print_json
from app.operations import sending
from app.operations.audit import Operator
from app.platform import db, mail_stop


def cmd_stop(args) -> int:
    db.init()
    print_json(sending.stop_sending(Operator.shell(), args.reason))
    return 0


def cmd_resume(args) -> int:
    db.init()
    print_json({"stopped": False, **sending.resume_sending(Operator.shell())})
    return 0


def cmd_status(args) -> int:
    db.init()
    state = mail_stop.state()
    print_json({"stopped": state is not None, **(state or {})})
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
