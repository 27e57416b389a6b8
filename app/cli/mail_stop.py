"""`python -m app stop-sending --reason …` and `python -m app resume-sending`: the emergency stop
for all outgoing mail (app/operations/sending.py, audited under the login name), from a shell."""

from __future__ import annotations

from app.cli import commands
from app.cli.output import print_json
from app.operations import sending
from app.operations.audit import Operator
from app.platform import db, mail_stop


def cmd_stop(args) -> int:
    """EMERGENCY STOP: every digest and newsletter sender stops within a second, until resume-sending"""
    db.init()
    print_json(sending.stop_sending(Operator.shell(), args.reason))
    return 0


def cmd_resume(args) -> int:
    """release the emergency stop: due digests and paused-by-stop newsletters continue, nothing lost or sent twice"""
    db.init()
    print_json({"stopped": False, **sending.resume_sending(Operator.shell())})
    return 0


def cmd_status(args) -> int:
    """whether the emergency stop is engaged, since when, by whom, why"""
    db.init()
    state = mail_stop.state()
    print_json({"stopped": state is not None, **(state or {})})
    return 0


def register(sub) -> None:
    p = commands.add(sub, "stop-sending", cmd_stop)
    p.add_argument("--reason", default="", help="shown on the dashboard and in the logs")
    commands.add(sub, "resume-sending", cmd_resume)
    commands.add(sub, "sending-status", cmd_status)
