"""The template context of one digest. Values are plain strings: chevron HTML-escapes {{tags}}, so
hostile actor names or titles are harmless in the HTML part; URLs from payloads must be http(s)."""
from __future__ import annotations

import re

from app import config
from digest.group import Digest, Group, actors_text

MAX_TITLE = 200
_UNSAFE_URL_CHARS = re.compile(r'[\s"<>]')


def safe_url(value) -> str:
    """Only absolute http(s) URLs become links (no javascript:, data:, relative paths)."""
    if not isinstance(value, str) or len(value) > 2000:
        return ""
    value = value.strip()
    lowered = value.lower()
    if not (lowered.startswith("https://") or lowered.startswith("http://")) or _UNSAFE_URL_CHARS.search(value):
        return ""
    return value


def _clip(text: str, limit: int = MAX_TITLE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def count_label(count: int, category: str) -> str:
    word = category.replace("_", " ")
    if count != 1 and not word.endswith("s"):
        word += "s"
    return f"{count} {word}"


def group_item(group: Group, payload: dict) -> dict:
    title = payload.get("title") or payload.get("entity_title") or f"{group.entity_type} {group.entity_id}"
    url, actors = safe_url(payload.get("url")), actors_text(group.actor_names())
    # Sections test booleans, never the strings: inside {{#url}} chevron would resolve {{title}}
    # against the str (str.title) instead of the item.
    return {
        "title": _clip(title),
        "url": url,
        "has_url": bool(url),
        "actors": actors,
        "has_actors": bool(actors),
        "count": group.count,
        "count_label": count_label(group.count, group.category),
        "category": group.category,
        "entity_type": group.entity_type,
        "entity_id": group.entity_id,
    }


def build(digest: Digest, payloads: dict[int, dict], *, cadence: str, name: str,
          unsubscribe_url: str, preferences_url: str, postal_address: str | None = None) -> dict:
    """`postal_address`: MAIL_POSTAL_ADDRESS by default (empty in development/test: no line)."""
    if postal_address is None:
        postal_address = config.get().mail_postal_address
    items = [group_item(g, payloads.get(g.latest_event_id) or {}) for g in digest.groups]
    top = items[0] if items else None
    updates = f"{digest.total_events} update{'s' if digest.total_events != 1 else ''}"
    if top and top["actors"]:
        headline = _clip(f"{top['actors']} on {top['title']}", 120)
    elif top:
        headline = _clip(f"{top['count_label']} on {top['title']}", 120)
    else:
        headline = updates
    first_name = _clip(name.split()[0], 60) if name and name.split() else ""
    return {
        "subject": "",  # filled after the subject template ran (the HTML <title>)
        "headline": headline,
        "heading": f"Hi {first_name}, here is your {cadence} digest" if first_name else f"Your {cadence} digest",
        "lead": f"{updates} since your last digest.",
        "preheader": headline,
        "cadence": cadence,
        "groups": items,
        "has_more": digest.more_groups > 0,
        "more_groups": digest.more_groups,
        "total_groups": digest.total_groups,
        "total_events": digest.total_events,
        "unsubscribe_url": unsubscribe_url,
        "preferences_url": preferences_url,
        "postal_address": postal_address,
        "has_postal_address": bool(postal_address),
    }
