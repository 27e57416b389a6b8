"""The words of a digest, in its reader's language: actor lists, one line per category, relative
times in the subscriber's zone, "since Tuesday", and the subject. Pure functions of a Translator
(app/platform/i18n.py: the messages are English in the code, translated by the catalogs in
app/locale/; lists, plurals, dates and numbers follow CLDR). Tested in tests/digest/test_logic.py
and tests/digest/test_languages.py.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

from app.platform.i18n import SOURCE, Translator, translator
from app.subscribers.categories import Category

# English only: inside an entity's block the title is the heading, so "commented on" reads "Gus
# commented". A category's translated verb is its translator's, word order and preposition included.
_TRAILING_PREPOSITIONS = frozenset({"on", "to", "in", "at", "for", "with", "about", "of", "from", "into", "onto"})


def _t(t: Translator | None) -> Translator:
    return t if t is not None else translator(SOURCE)


def actors_text(names: list[str], shown: int = 2, t: Translator | None = None) -> str:
    """ "Ana", "Ana and Bo", "Ana, Bo and Cy", "Ana, Bo and 3 others" (the locale's list pattern)."""
    t = _t(t)
    if len(names) <= shown + 1:
        return t.join(names)
    rest = len(names) - shown
    return t.join([*names[:shown], t.ngettext("{count} other", "{count} others", rest)])


def block_verb(verb: str) -> str:
    """The verb inside an entity's block: "commented on" -> "commented", "mentioned you in" ->
    "mentioned you", "liked" -> "liked"."""
    words = verb.split()
    if len(words) > 1 and words[-1].lower() in _TRAILING_PREPOSITIONS:
        words = words[:-1]
    return " ".join(words)


def line_text(category: Category, actors: list[str], count: int, t: Translator | None = None) -> str:
    """One category of one entity:
    with a verb      "Eli, Bo and 3 others followed", "Gus commented 4 times"
    without a verb   "Likes from Eli and Bo", "Comments from Gus (4)"
    nobody named     "Likes (3)"."""
    t = _t(t)
    if not actors:
        return t.gettext("{label} ({count})", label=category.label, count=t.number(count))
    who = actors_text(actors, t=t)
    extra = count - len(actors)
    if category.verb:
        # A translation's verb is its translator's; the default's is English when the reader's is.
        english = category.locale.split("-")[0] == SOURCE if category.locale else t.locale.language == SOURCE
        verb = block_verb(category.verb) if english else category.verb
        if extra > 0:
            return t.ngettext(
                "{actors} {verb} {count} time", "{actors} {verb} {count} times", count, actors=who, verb=verb
            )
        return t.gettext("{actors} {verb}", actors=who, verb=verb)
    if extra > 0:
        return t.gettext("{label} from {actors} ({count})", label=category.label, actors=who, count=t.number(count))
    return t.gettext("{label} from {actors}", label=category.label, actors=who)


def headline(category: Category, actors: list[str], count: int, title: str, t: Translator | None = None) -> str:
    """The top entity's top line, naming the entity: "Eli and 5 others followed Launch notes",
    "Gus commented on Launch notes", "Likes from Eli on Launch notes", "Likes (3) on Launch notes"."""
    t = _t(t)
    if actors and category.verb:
        return t.gettext("{actors} {verb} {title}", actors=actors_text(actors, t=t), verb=category.verb, title=title)
    if actors:
        return t.gettext(
            "{label} from {actors} on {title}", label=category.label, actors=actors_text(actors, t=t), title=title
        )
    return t.gettext("{label} ({count}) on {title}", label=category.label, count=t.number(count), title=title)


def updates(count: int, t: Translator | None = None) -> str:
    """ "1 update", "20 updates": an update is one event, in the subject, the lead and the tail alike."""
    return _t(t).ngettext("{count} update", "{count} updates", count)


def subject(top: str, more_updates: int, t: Translator | None = None) -> str:
    """ "Eli and 5 others followed Launch notes — and 14 more updates": `more_updates` counts the
    updates beside the headline's own, so the two add up to the lead's "20 updates"."""
    if more_updates <= 0:
        return top
    return _t(t).ngettext(
        "{headline} — and {count} more update", "{headline} — and {count} more updates", more_updates, headline=top
    )


def plural(noun: str) -> str:
    """English only: "post" -> "posts", "issue" -> "issues", "story" -> "stories", "branch" -> "branches"."""
    if noun.endswith("y") and noun[-2:-1] not in ("", *"aeiou"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def things(count: int, kinds: set[str], t: Translator | None = None) -> str:
    """What the entities left out are: "1 other post", "3 other posts", "3 other items" (mixed kinds).
    An entity type is the product's word, English: other languages say "items" (translated) rather
    than guess a plural of it."""
    t = _t(t)
    if len(kinds) == 1 and t.tag == SOURCE:
        noun = next(iter(kinds)).lower()
        return f"{count} other {noun if count == 1 else plural(noun)}"
    return t.ngettext("{count} other item", "{count} other items", count)


def more(more_updates: int, more_groups: int, kinds: set[str], t: Translator | None = None) -> str:
    """The digest's last line when the cap left entities out, counted like the subject:
    "…and 7 more updates on 3 other posts"."""
    t = _t(t)
    updates_text = t.ngettext("{count} more update", "{count} more updates", more_updates)
    return t.gettext("…and {updates} on {things}", updates=updates_text, things=things(more_groups, kinds, t))


def cadence_name(cadence: str, t: Translator | None = None) -> str:
    """What a person calls each cadence (the preference page's words); `immediately` is no digest."""
    t = _t(t)
    names = {
        "immediately": t.gettext("as it happens"),
        "hourly": t.gettext("hourly digest"),
        "daily": t.gettext("daily digest"),
        "weekly": t.gettext("weekly digest"),
        "off": t.gettext("no digests"),
    }
    return names.get(cadence, cadence)


def heading(greeting: str, cadence: str, t: Translator | None = None, held: bool = False) -> str:
    """ "Hi Ana, here is your daily digest"; a mail sent as things happen is "Hi Ana, here is what's
    new"; one that waited for the end of the subscriber's quiet hours "Hi Ana, while you were away:"."""
    t = _t(t)
    if held:
        return t.gettext("{greeting} while you were away:", greeting=greeting)
    if cadence == "hourly":
        return t.gettext("{greeting} here is your hourly digest", greeting=greeting)
    if cadence == "weekly":
        return t.gettext("{greeting} here is your weekly digest", greeting=greeting)
    if cadence == "immediately":
        return t.gettext("{greeting} here is what's new", greeting=greeting)
    return t.gettext("{greeting} here is your daily digest", greeting=greeting)


def reason(cadence: str, t: Translator | None = None) -> str:
    """Why this mail came, for the footer."""
    t = _t(t)
    if cadence == "hourly":
        return t.gettext("You get this hourly digest because you have an account with notifications turned on.")
    if cadence == "weekly":
        return t.gettext("You get this weekly digest because you have an account with notifications turned on.")
    if cadence == "immediately":
        return t.gettext("You get this email because you have an account with notifications turned on.")
    return t.gettext("You get this daily digest because you have an account with notifications turned on.")


def _clock(t: Translator, local: datetime) -> str:
    return t.skeleton(local, "Hm")


def _day_month(t: Translator, local: datetime, now_local: datetime, long: bool) -> str:
    if local.year == now_local.year:
        return t.skeleton(local, "MMMMd" if long else "MMMd")
    return t.skeleton(local, "yMMMMd" if long else "yMMMd")


def relative_time(when: datetime, now: datetime, zone: tzinfo, t: Translator | None = None) -> str:
    """When something happened, as the subscriber reads it: "just now", "5 min ago", "2 h ago",
    then in their zone "yesterday 18:05", "Tuesday 09:12", "3 Mar", "3 Mar 2025"."""
    t = _t(t)
    seconds = (now - when).total_seconds()
    if seconds < 60:
        return t.gettext("just now")
    if seconds < 3600:
        return t.ngettext("{count} min ago", "{count} min ago", int(seconds // 60))
    if seconds < 12 * 3600:
        return t.ngettext("{count} h ago", "{count} h ago", int(seconds // 3600))
    local, now_local = when.astimezone(zone), now.astimezone(zone)
    days = (now_local.date() - local.date()).days
    if days <= 0:
        return t.ngettext("{count} h ago", "{count} h ago", int(seconds // 3600))
    if days == 1:
        return t.gettext("yesterday {time}", time=_clock(t, local))
    if days < 7:
        return t.gettext("{weekday} {time}", weekday=t.weekday(local), time=_clock(t, local))
    return _day_month(t, local, now_local, long=False)


def since(previous: datetime, now: datetime, zone: tzinfo, t: Translator | None = None) -> str:
    """The range since the previous digest, in the subscriber's zone: "since 09:00", "since
    yesterday", "since Tuesday", "since 3 March", "since 3 March 2025"."""
    t = _t(t)
    local, now_local = previous.astimezone(zone), now.astimezone(zone)
    days = (now_local.date() - local.date()).days
    if days <= 0:
        return t.gettext("since {time}", time=_clock(t, local))
    if days == 1:
        return t.gettext("since yesterday")
    if days < 7:
        return t.gettext("since {weekday}", weekday=t.weekday(local))
    return t.gettext("since {date}", date=_day_month(t, local, now_local, long=True))


def lead(
    total_events: int,
    previous: datetime | None,
    now: datetime,
    zone: tzinfo,
    cadence: str = "daily",
    t: Translator | None = None,
) -> str:
    """ "12 updates since Tuesday." / "Your first digest: 12 updates." (no previous digest; a mail
    sent as things happen is no digest: "12 updates.")."""
    t = _t(t)
    if previous is None and cadence == "immediately":
        return t.ngettext("{count} update.", "{count} updates.", total_events)
    if previous is None:
        return t.ngettext("Your first digest: {count} update.", "Your first digest: {count} updates.", total_events)
    return t.ngettext(
        "{count} update {since}.", "{count} updates {since}.", total_events, since=since(previous, now, zone, t)
    )
