"""Group events by the entity they are about, one line per category inside it; rank; cap.

One block per entity (entity_type, entity_id); inside it one line per category with its actors
(distinct, most recent first), its count and the time of its latest event. Events the recipient
caused (actor_id == their user_id) are never shown, but they are handled: their ids stay in
`event_ids`, so they are marked with the run and do not pile up; what they say about an entity
shown anyway (its title, its link) still counts.

Ranking (the README states it): an entity's score is the number of distinct (actor, category)
pairs in it — Eli liking and commenting counts 2, Eli liking ten times counts 1 — plus one for each
event without an actor. Higher score first; ties: the most recent activity first, then the newest
event id (stable). Lines inside an entity are ranked the same way, except that a line with an event
sent with priority high comes first (an urgent mention is never last). The cap (DIGEST_MAX_ITEMS)
counts entities; the rest are summarised as "and N more".

Pure functions over plain tuples so they are cheap and testable without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import NamedTuple

# A line's or group's latest_at before its first event: older than any event.
NEVER = datetime.min.replace(tzinfo=UTC)


class Event(NamedTuple):
    """The columns of digest_events that grouping needs (payload fields are read later, only for
    shown entities). A NamedTuple: built straight from a database row, ~5x cheaper than a dataclass."""

    id: int
    category: str
    entity_type: str
    entity_id: str
    actor_id: str | None
    actor_name: str | None
    occurred_at: datetime
    high_priority: bool | None = None


_NEWEST = attrgetter("occurred_at", "id")


class Line:
    """One category of one entity."""

    __slots__ = ("_keys", "actors", "category", "count", "high", "latest_at", "latest_event_id", "score")

    def __init__(self, category: str):
        self.category = category
        self.high = False  # any of its events sent with priority high: the line goes first
        self.count = 0
        self.score = 0  # distinct actors + events without an actor
        self.latest_at = NEVER  # until its first event
        self.latest_event_id = 0
        self.actors: dict = {}  # actor key -> (last seen, display name)
        self._keys: list[str] | None = None

    def actor_keys(self) -> list[str]:
        """Distinct actors, most recent first (computed once: call after grouping)."""
        if self._keys is None:
            actors = self.actors
            self._keys = sorted(actors, key=lambda k: actors[k][0], reverse=True) if len(actors) > 1 else list(actors)
        return self._keys

    def actor_names(self) -> list[str]:
        return [self.actors[k][1] for k in self.actor_keys()]


class Group:
    """One entity: its lines, its events (for titles and links) and its rank."""

    __slots__ = ("_ranked", "count", "events", "key", "latest_at", "latest_event_id", "lines", "score", "title", "url")

    def __init__(self, key: tuple):
        self.key = key  # (entity_type, entity_id)
        self.count = 0
        self.score = 0  # the sum of its lines' scores
        self.latest_at = NEVER  # until its first event
        self.latest_event_id = 0
        self.lines: dict[str, Line] = {}
        self.events: list[Event] = []  # for its title and link (digest/details.py)
        self.title: str | None = None  # from its events (digest/details.py)
        self.url = ""
        self._ranked: list[Line] | None = None

    @property
    def entity_type(self) -> str:
        return self.key[0]

    @property
    def entity_id(self) -> str:
        return self.key[1]

    def ranked_lines(self) -> list[Line]:
        """Computed once: call after grouping."""
        if self._ranked is None:
            lines = self.lines
            self._ranked = (
                sorted(lines.values(), key=_rank_line, reverse=True) if len(lines) > 1 else list(lines.values())
            )
        return self._ranked

    def newest_event_ids(self) -> list[int]:
        return newest_ids(self.events)


def newest_ids(events: list[Event]) -> list[int]:
    """Ids newest first: by occurred_at, then id."""
    return [ev.id for ev in sorted(events, key=_NEWEST, reverse=True)]


def _rank(item) -> tuple:
    return (item.score, item.latest_at, item.latest_event_id)


def _rank_line(line: Line) -> tuple:
    return (line.high, line.score, line.latest_at, line.latest_event_id)


@dataclass
class Digest:
    groups: list[Group]  # the shown entities, ranked, at most max_items
    more_groups: int  # entities left out ("and N more")
    total_groups: int
    total_events: int  # events shown or summarised (not the recipient's own)
    event_ids: list[int]  # every loaded event, own ones included: all get marked
    own_events: int = 0  # the recipient's own activity: handled, never shown
    seen_events: int = 0  # seen in the app before the digest was built: handled, never shown (digest/seen.py)
    # actor key -> their events here (whose avatar: digest/details.py)
    actor_events: dict = field(default_factory=dict)
    avatars: dict = field(default_factory=dict)  # actor key -> avatar URL (digest/details.py)
    more_events: int = 0  # the updates of the entities left out
    more_kinds: set = field(default_factory=set)  # their entity types ("and 7 more updates on 3 other posts")

    @property
    def empty(self) -> bool:
        return not self.groups


def group_events(events, recipient: str | None = None) -> tuple[list[Group], dict, int]:
    """(entities, actor key -> their events, own events skipped)."""
    groups: dict[tuple, Group] = {}
    actor_events: dict[str, list] = {}
    own: list = []
    for ev in events:
        actor_id = ev.actor_id
        if recipient is not None and actor_id == recipient:
            own.append(ev)
            continue
        when = ev.occurred_at
        key = (ev.entity_type, ev.entity_id)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(key)
        g.count += 1
        g.events.append(ev)
        if when > g.latest_at or (when == g.latest_at and ev.id > g.latest_event_id):
            g.latest_at, g.latest_event_id = when, ev.id
        line = g.lines.get(ev.category)
        if line is None:
            line = g.lines[ev.category] = Line(ev.category)
        line.count += 1
        if ev.high_priority:
            line.high = True
        if when > line.latest_at or (when == line.latest_at and ev.id > line.latest_event_id):
            line.latest_at, line.latest_event_id = when, ev.id
        actor_key = actor_id or ev.actor_name
        if actor_key:
            seen = line.actors.get(actor_key)
            if seen is None:
                line.score += 1
                g.score += 1
                line.actors[actor_key] = (when, ev.actor_name or actor_id)
            elif when >= seen[0]:
                line.actors[actor_key] = (when, ev.actor_name or actor_id)
            mine = actor_events.get(actor_key)
            if mine is None:
                actor_events[actor_key] = [ev]
            else:
                mine.append(ev)
        else:
            line.score += 1
            g.score += 1
    for ev in own:  # not shown, but what they say about an entity shown anyway counts (its title, link)
        g = groups.get((ev.entity_type, ev.entity_id))
        if g is not None:
            g.events.append(ev)
    return list(groups.values()), actor_events, len(own)


def rank(groups: list[Group]) -> list[Group]:
    return sorted(groups, key=_rank, reverse=True)


def build(events, max_items: int, recipient: str | None = None) -> Digest:
    """`recipient`: the subscriber's user_id; their own events are handled but never shown."""
    events = list(events)
    entities, actor_events, own = group_events(events, recipient)
    ranked = rank(entities)
    shown = ranked[: max(1, max_items)]
    hidden = ranked[len(shown) :]
    return Digest(
        groups=shown,
        more_groups=len(ranked) - len(shown),
        total_groups=len(ranked),
        total_events=len(events) - own,
        event_ids=[ev.id for ev in events],
        own_events=own,
        actor_events=actor_events,
        more_events=sum(g.count for g in hidden),
        more_kinds={g.entity_type for g in hidden},
    )
