"""The audit trail of what operators changed: the one writer of `admin_audit`.

Who is an Operator: an admin API key signed in to /admin (its id and name at the time, the client
address, the session), or a person at a shell running `notify` (their login name, no key). Rows are
written in the transaction of the change they record and never updated or deleted.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Any

from app.platform import db


@dataclass(frozen=True)
class Operator:
    name: str  # the API key's name, or "cli:<login>"
    key_id: int | None = None  # None: a command at a shell
    ip: str | None = None
    session_id: int | None = None

    @classmethod
    def shell(cls) -> Operator:
        try:
            return cls(f"cli:{getpass.getuser()}")
        except Exception:  # no login name in this environment (a container's uid without a passwd entry)
            return cls("cli")

    @property
    def label(self) -> str:
        """How logs and the emergency stop's row name them: "admin:<key name>" or "cli:<login>"."""
        return self.name if self.key_id is None else f"admin:{self.name}"


def record(cur: db.Cursor, operator: Operator, action: str, target: str, detail: dict[str, Any]) -> None:
    if operator.session_id is not None:
        detail = {**detail, "session_id": operator.session_id}
    cur.execute(
        "INSERT INTO admin_audit (api_key_id, api_key_name, action, target, detail, ip) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (operator.key_id, operator.name, action, target, db.json(detail), operator.ip),
    )


def recent(limit: int = 10) -> list[tuple]:
    """The latest audited changes: (at, key name, key id, action, target, detail)."""
    return db.query(
        "SELECT at, api_key_name, api_key_id, action, target, detail FROM admin_audit ORDER BY id DESC LIMIT %s",
        (limit,),
    )
