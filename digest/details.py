"""Titles, links and avatars: per field, the newest event of the digest that carries a usable value.

The fields (documented on the Event model, digest/ingest.py; stored in `payload`):
  entity title   `entity_title` (or `title`, as earlier producers sent it)
  entity link    `entity_url`   (or `url`)
  actor avatar   `actor_avatar_url`, per actor
Within one event the documented key wins over the older one. A URL counts only if it is an
absolute http(s) URL (app/platform/urls.py): anything else is dropped, never rendered, so an older event's
good link is used instead. Titles fall back to the entity's type and id ("Post p9").

Cost: payloads are read only for the shown entities and their lines' leading actors, and only the
fields above (extracted by Postgres). One statement per batch reads the newest event of each; a
second one reads further back only for what is still missing, only the keys still wanted (a
producer that never sends avatars costs index probes, no rows).
"""

from __future__ import annotations

from operator import attrgetter

from app.platform import urls
from digest import load as digest_load
from digest.group import Digest, Event, Group, newest_ids

# The payload keys read, in the order load_fields returns them; within an event the documented key
# comes first (entity_title over title, entity_url over url).
KEYS = ("entity_title", "title", "entity_url", "url", "actor_avatar_url")
TITLE, URL, AVATAR = (0, 1), (2, 3), (4,)
_NEWEST = attrgetter("occurred_at", "id")


def _text(row: tuple, columns: tuple) -> str | None:
    for c in columns:
        value = row[c]
        if value and not value.isspace():
            return value
    return None


def _url(row: tuple, columns: tuple) -> str:
    for c in columns:
        value = row[c] and urls.http_url(row[c])
        if value:
            return value
    return ""


def entity_fields(rows, title: str | None = None, url: str = "") -> tuple[str | None, str]:
    """(title, url) from an entity's events' rows, newest first: per field the first usable value
    (a URL that is not absolute http(s) is no value), starting from what was found already."""
    for row in rows:
        if title is None:
            title = _text(row, TITLE)
        if not url:
            url = _url(row, URL)
        if title is not None and url:
            break
    return title, url


def avatar(rows) -> str:
    """An actor's avatar from their events' rows, newest first."""
    return next((value for row in rows if (value := _url(row, AVATAR))), "")


def _newest(events: list[Event]) -> int:
    return (events[0] if len(events) == 1 else max(events, key=_NEWEST)).id


def resolve(cur, digests: list[Digest]) -> None:
    """Fill group.title / group.url and digest.avatars for every shown entity of `digests`."""
    entities: list[tuple[Group, int]] = []
    actors: list[tuple[Digest, str, list[Event], int]] = []
    for d in digests:
        for g in d.groups:
            # latest_event_id is the newest shown event; the subscriber's own events come after
            # them in g.events and may be newer.
            entities.append((g, g.latest_event_id if len(g.events) == g.count else _newest(g.events)))
        for key in {line.actor_keys()[0] for g in d.groups for line in g.lines.values() if line.actors}:
            events = d.actor_events[key]
            actors.append((d, key, events, _newest(events)))
    # The newest event of each first: a producer that sends the fields with every event is done here.
    values = digest_load.load_fields(cur, {n for _, n in entities} | {a[3] for a in actors}, KEYS)
    older_entities, older_actors = [], []
    for g, newest in entities:
        row = values.get(newest)
        if row is not None:
            g.title, g.url = entity_fields((row,))
        if (g.title is None or not g.url) and len(g.events) > 1:
            older_entities.append((g, newest))
    for d, key, events, newest in actors:
        row = values.get(newest)
        found = avatar((row,)) if row is not None else ""
        if found:
            d.avatars[key] = found
        elif len(events) > 1:
            older_actors.append((d, key, events, newest))
    if older_entities or older_actors:
        _older(cur, older_entities, older_actors)


def _older(cur, entities: list, actors: list) -> None:
    """The older events, only for what is still missing and only those keys. Most of these rows do
    not exist (a producer that never sends avatars): events are sorted only where a row came back."""
    wanted: set[str] = set()
    for g, _ in entities:
        wanted.update(KEYS[c] for c in ((TITLE if g.title is None else ()) + (URL if not g.url else ())))
    if actors:
        wanted.add(KEYS[AVATAR[0]])
    ids = {ev.id for g, newest in entities for ev in g.events if ev.id != newest}
    ids.update(ev.id for _, _, events, newest in actors for ev in events if ev.id != newest)
    values = digest_load.load_fields(cur, ids, KEYS, any_of=sorted(wanted))
    if not values:
        return
    for g, _ in entities:
        if any(ev.id in values for ev in g.events):
            rows = (values[i] for i in newest_ids(g.events) if i in values)
            g.title, g.url = entity_fields(rows, g.title, g.url)
    for d, key, events, _ in actors:
        if any(ev.id in values for ev in events):
            found = avatar(values[i] for i in newest_ids(events) if i in values)
            if found:
                d.avatars[key] = found
