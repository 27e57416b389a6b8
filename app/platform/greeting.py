"""How every mail addresses its reader, digests and newsletters alike: "Hi Ana," (the first word of
their name), and "Hi," for a subscriber without one (or "Hi <NAME_FALLBACK>," when that is set).
The greeting ends with its comma, so it reads on its own line or before more words."""

from __future__ import annotations

MAX_FIRST_NAME = 60


def first_name(name: str | None) -> str:
    """The first word of a name, at most MAX_FIRST_NAME characters; "" without one."""
    words = (name or "").split()
    return words[0][:MAX_FIRST_NAME] if words else ""


def greeting(name: str | None, fallback: str = "") -> str:
    """ "Hi Ana," / "Hi," (`fallback`: who a nameless reader is, usually nobody)."""
    who = first_name(name) or " ".join(fallback.split())
    return f"Hi {who}," if who else "Hi,"
