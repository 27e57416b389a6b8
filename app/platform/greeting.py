"""How every mail addresses its reader, digests and newsletters alike: "Hi Ana," (the first word of
their name), and "Hi," for a subscriber without one (or "Hi <NAME_FALLBACK>," when that is set), in
the reader's language (app/platform/i18n.py). The greeting ends with its comma (or what the
language puts there), so it reads on its own line or before more words."""

from __future__ import annotations

from app.platform.i18n import SOURCE, Translator, translator

MAX_FIRST_NAME = 60


def first_name(name: str | None) -> str:
    """The first word of a name, at most MAX_FIRST_NAME characters; "" without one."""
    words = (name or "").split()
    return words[0][:MAX_FIRST_NAME] if words else ""


def greeting(name: str | None, fallback: str = "", t: Translator | None = None) -> str:
    """ "Hi Ana," / "Hi," (`fallback`: who a nameless reader is, usually nobody)."""
    t = t if t is not None else translator(SOURCE)
    who = first_name(name) or " ".join(fallback.split())
    return t.gettext("Hi {name},", name=who) if who else t.gettext("Hi,")
