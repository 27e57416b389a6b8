"""The words of a digest: actor lists, one line per category, relative times in the subscriber's
zone, "since Tuesday", and the subject. Pure functions (English), tested in tests/digest/test_logic.py.
"""

from __future__ import annotations

from datetime import datetime, tzinfo

from app.subscribers.categories import Category

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# Inside an entity's block the title is the heading, so "commented on" reads "Gus commented".
_TRAILING_PREPOSITIONS = frozenset({"on", "to", "in", "at", "for", "with", "about", "of", "from", "into", "onto"})


def actors_text(names: list[str], shown: int = 2) -> str:
    """ "Ana", "Ana and Bo", "Ana, Bo and Cy", "Ana, Bo and 3 others"."""
    if not names:
        return ""
    if len(names) == 1:
        return names[0]
    if len(names) <= shown + 1:
        return f"{', '.join(names[:-1])} and {names[-1]}"
    rest = len(names) - shown
    return f"{', '.join(names[:shown])} and {rest} other{'s' if rest != 1 else ''}"


def block_verb(verb: str) -> str:
    """The verb inside an entity's block: "commented on" -> "commented", "mentioned you in" ->
    "mentioned you", "liked" -> "liked"."""
    words = verb.split()
    if len(words) > 1 and words[-1].lower() in _TRAILING_PREPOSITIONS:
        words = words[:-1]
    return " ".join(words)


def line_text(category: Category, actors: list[str], count: int) -> str:
    """One category of one entity:
    with a verb      "Eli, Bo and 3 others followed", "Gus commented 4 times"
    without a verb   "Likes from Eli and Bo", "Comments from Gus (4)"
    nobody named     "Likes (3)"."""
    if not actors:
        return f"{category.label} ({count})"
    who = actors_text(actors)
    extra = count - len(actors)
    if category.verb:
        return f"{who} {block_verb(category.verb)}" + (f" {count} times" if extra > 0 else "")
    return f"{category.label} from {who}" + (f" ({count})" if extra > 0 else "")


def headline(category: Category, actors: list[str], count: int, title: str) -> str:
    """The top entity's top line, naming the entity: "Eli and 5 others followed Launch notes",
    "Gus commented on Launch notes", "Likes from Eli on Launch notes", "Likes (3) on Launch notes"."""
    if actors and category.verb:
        return f"{actors_text(actors)} {category.verb} {title}"
    if actors:
        return f"{category.label} from {actors_text(actors)} on {title}"
    return f"{category.label} ({count}) on {title}"


def updates(count: int) -> str:
    """ "1 update", "20 updates": an update is one event, in the subject, the lead and the tail alike."""
    return f"{count} update{'s' if count != 1 else ''}"


def more_updates_text(count: int) -> str:
    """ "1 more update", "14 more updates"."""
    return f"{count} more update{'s' if count != 1 else ''}"


def subject(top: str, more_updates: int) -> str:
    """ "Eli and 5 others followed Launch notes — and 14 more updates": `more_updates` counts the
    updates beside the headline's own, so the two add up to the lead's "20 updates"."""
    if more_updates <= 0:
        return top
    return f"{top} — and {more_updates_text(more_updates)}"


def plural(noun: str) -> str:
    """ "post" -> "posts", "issue" -> "issues", "story" -> "stories", "branch" -> "branches"."""
    if noun.endswith("y") and noun[-2:-1] not in ("", *"aeiou"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def things(count: int, kinds: set[str]) -> str:
    """What the entities left out are: "1 other post", "3 other posts", "3 other items" (mixed kinds)."""
    noun = next(iter(kinds)).lower() if len(kinds) == 1 else "item"
    return f"{count} other {noun if count == 1 else plural(noun)}"


def more(more_updates: int, more_groups: int, kinds: set[str]) -> str:
    """The digest's last line when the cap left entities out, counted like the subject:
    "…and 7 more updates on 3 other posts"."""
    return f"…and {more_updates_text(more_updates)} on {things(more_groups, kinds)}"


# What a person calls each cadence (the preference page's words); `immediately` is no digest at all.
CADENCE_NAMES = {
    "immediately": "as it happens",
    "hourly": "hourly digest",
    "daily": "daily digest",
    "weekly": "weekly digest",
    "off": "no digests",
}


def cadence_name(cadence: str) -> str:
    return CADENCE_NAMES.get(cadence, f"{cadence} digest")


def heading(greeting: str, cadence: str) -> str:
    """ "Hi Ana, here is your daily digest"; a mail sent as things happen is "Hi Ana, here is what's new"."""
    if cadence == "immediately":
        return f"{greeting} here is what's new"
    return f"{greeting} here is your {cadence_name(cadence)}"


def reason(cadence: str) -> str:
    """Why this mail came, for the footer."""
    what = "this email" if cadence == "immediately" else f"this {cadence_name(cadence)}"
    return f"You get {what} because you have an account with notifications turned on."


def _local(when: datetime, zone: tzinfo) -> datetime:
    return when.astimezone(zone)


def _day_month(local: datetime, now_local: datetime, long: bool) -> str:
    month = MONTHS[local.month - 1] if long else MONTHS[local.month - 1][:3]
    text = f"{local.day} {month}"
    return text if local.year == now_local.year else f"{text} {local.year}"


def relative_time(when: datetime, now: datetime, zone: tzinfo) -> str:
    """When something happened, as the subscriber reads it: "just now", "5 min ago", "2 h ago",
    then in their zone "yesterday 18:05", "Tuesday 09:12", "3 Mar", "3 Mar 2025"."""
    seconds = (now - when).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 12 * 3600:
        return f"{int(seconds // 3600)} h ago"
    local, now_local = _local(when, zone), _local(now, zone)
    days = (now_local.date() - local.date()).days
    clock = f"{local.hour:02d}:{local.minute:02d}"
    if days <= 0:
        return f"{int(seconds // 3600)} h ago"
    if days == 1:
        return f"yesterday {clock}"
    if days < 7:
        return f"{WEEKDAYS[local.weekday()]} {clock}"
    return _day_month(local, now_local, long=False)


def since(previous: datetime, now: datetime, zone: tzinfo) -> str:
    """The range since the previous digest, in the subscriber's zone: "since 09:00", "since
    yesterday", "since Tuesday", "since 3 March", "since 3 March 2025"."""
    local, now_local = _local(previous, zone), _local(now, zone)
    days = (now_local.date() - local.date()).days
    if days <= 0:
        return f"since {local.hour:02d}:{local.minute:02d}"
    if days == 1:
        return "since yesterday"
    if days < 7:
        return f"since {WEEKDAYS[local.weekday()]}"
    return f"since {_day_month(local, now_local, long=True)}"


def lead(total_events: int, previous: datetime | None, now: datetime, zone: tzinfo, cadence: str = "daily") -> str:
    """ "12 updates since Tuesday." / "Your first digest: 12 updates." (no previous digest; a mail
    sent as things happen is no digest: "12 updates.")."""
    if previous is None and cadence == "immediately":
        return f"{updates(total_events)}."
    if previous is None:
        return f"Your first digest: {updates(total_events)}."
    return f"{updates(total_events)} {since(previous, now, zone)}."
