"""Titles, links and avatars: per field, the newest event of the digest that carries a usable value.

The fields (documented on the Event model, app/ingest.py; stored in `payload`):
  entity title   `entity_title` (or `title`, as earlier producers sent it)
  entity link    `entity_url`   (or `url`)
  actor avatar   `actor_avatar_url`, per actor
Within one event the documented key wins over the older one. A URL counts only if it is an
absolute http(s) URL (app/urls.py): anything else is dropped, never rendered, so an older event's
good link is used instead. Titles fall back to the entity's type and id ("Post p9").

Cost: payloads are read only for the shown entities and their lines' leading actors, and only the
fields above (extracted by Postgres). One statement per batch reads the newest event of each
(FIRST_PASS); a second one reads further back only for what is still missing, only the keys still
wanted (a producer that never sends avatars costs index probes, no rows).
"""
from __future__ import annotations

from app import urls
from digest import load as digest_load
from digest.group import Digest, newest_ids

FIRST_PASS = 1
ENTITY_FIELDS = {"title": ("entity_title", "title"), "url": ("entity_url", "url")}
ACTOR_FIELDS = {"avatar": ("actor_avatar_url",)}
_URL_FIELDS = frozenset({"url", "avatar"})


class _Want:
    """What one entity (or actor) still needs, and the ids of its events, newest first."""
    __slots__ = ("ids", "fields", "found")

    def __init__(self, ids: list[int], fields: dict):
        self.ids, self.fields, self.found = ids, dict(fields), {}

    def take(self, values: dict[int, tuple], position: dict[str, int], start: int, stop: int | None) -> None:
        """Walk this want's events (newest first) from `start` to `stop`; values[id] holds the
        fields in `position` order."""
        for event_id in self.ids[start:stop]:
            row = values.get(event_id)
            if row is None:
                continue
            for name, keys in list(self.fields.items()):
                for key in keys:
                    value = row[position[key]] if key in position else None
                    if value and name in _URL_FIELDS:
                        value = urls.http_url(value)
                    if value and value.strip():
                        self.found[name] = value.strip() if name in _URL_FIELDS else value
                        del self.fields[name]
                        break
            if not self.fields:
                return


def resolve(cur, digests: list[Digest], first_pass: int = FIRST_PASS) -> None:
    """Fill group.title / group.url and digest.avatars for every shown entity of `digests`."""
    wants: list[tuple[object, _Want]] = []
    for d in digests:
        for g in d.groups:
            wants.append((g, _Want(g.newest_event_ids(), ENTITY_FIELDS)))
        leads = {line.actor_keys()[0] for g in d.groups for line in g.lines.values() if line.actors}
        for key in leads:
            wants.append(((d, key), _Want(newest_ids(d.actor_events.get(key, [])), ACTOR_FIELDS)))
    _pass(cur, [w for _, w in wants], 0, first_pass)
    _pass(cur, [w for _, w in wants if w.fields and len(w.ids) > first_pass], first_pass, None)
    for owner, want in wants:
        if isinstance(owner, tuple):
            d, key = owner
            if "avatar" in want.found:
                d.avatars[key] = want.found["avatar"]
        else:
            owner.title = want.found.get("title")
            owner.url = want.found.get("url", "")


def _pass(cur, wants: list[_Want], start: int, stop: int | None) -> None:
    if not wants:
        return
    ids = {i for w in wants for i in w.ids[start:stop]}
    keys = sorted({k for w in wants for keys in w.fields.values() for k in keys})
    values = digest_load.load_fields(cur, ids, keys)
    position = {key: i for i, key in enumerate(keys)}
    for want in wants:
        want.take(values, position, start, stop)
