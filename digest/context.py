"""The template context of one digest. Values are plain strings: Mustache (app/platform/mustache.py)
HTML-escapes {{tags}}, so hostile actor names or titles are harmless in the HTML part; URLs are
http(s) only (app/platform/urls.py, digest/details.py).

Per shown entity (`groups`): title, url/has_url, lines (one per category: summary, when, label,
count, avatar_url/has_avatar), summary (the lines joined), count, count_label. Per digest: subject
(filled from subject.txt), subject_line, headline, greeting, heading, reason (the footer's why), lead,
preheader, has_more/more_groups/more (the last line: "…and 7 more updates on 3 other posts"),
total_groups, total_events, first_digest, the footer's links and postal address, view_url/has_view_url
(the hosted copy, digest/hosted.py). Every word is in the reader's locale (`Reader.locale`, through
app/platform/i18n.py), a category's label and verb included (its translation along the reader's
fallback chain: app/subscribers/categories.py `lookup`); `lang` and `dir` go on the mail's <html>, and
the template's own words (view_in_browser, change_cadence, unsubscribe) come from here, translated, too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.platform import config, greeting, i18n, timezones
from app.subscribers.categories import Category, humanise, lookup
from digest import wording
from digest.group import Digest, Group

MAX_TITLE = 200
MAX_LINE = 300
# Whitespace runs become one space (str.split); other control characters are dropped.
_CONTROL = dict.fromkeys([*range(0, 32), 127])


def clip(text: str, limit: int = MAX_TITLE) -> str:
    """One line of at most `limit` characters, blanks collapsed, control characters dropped."""
    if len(text) <= limit and text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text  # the usual case, without splitting and joining
    text = " ".join(str(text).split())
    if not text.isprintable():
        text = text.translate(_CONTROL)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def entity_title(group: Group, t: i18n.Translator | None = None) -> str:
    """The entity's title, or its kind and id ("Post p9") when the events gave none."""
    if group.title:
        return clip(group.title)
    t = t or i18n.translator(i18n.SOURCE)
    return clip(t.gettext("{kind} {id}", kind=humanise(group.entity_type), id=group.entity_id))


def ordered_lines(group: Group, categories: dict[str, Category]) -> list:
    """The entity's lines as ranked, what cannot wait first: a line with a high-priority event or of a
    "send now" category (an urgent mention leads its entity instead of trailing it)."""
    ranked = group.ranked_lines()
    if len(ranked) < 2:
        return ranked
    return sorted(ranked, key=lambda line: not (line.high or lookup(line.category, categories).delivery == "immediate"))


def group_item(
    group: Group, digest: Digest, categories: dict[str, Category], now: datetime, tz, t: i18n.Translator | None = None
) -> dict:
    t = t or i18n.translator(i18n.SOURCE)
    lines: list[dict[str, Any]] = []
    for line in ordered_lines(group, categories):
        category = lookup(line.category, categories, t.tag)  # in the reader's words (its translations)
        keys = line.actor_keys()
        names = [line.actors[k][1] for k in keys]
        avatar = digest.avatars.get(keys[0], "") if keys else ""
        lines.append(
            {
                "summary": clip(wording.line_text(category, names, line.count, t), MAX_LINE),
                "when": wording.relative_time(line.latest_at, now, tz, t),
                "category": line.category,
                "label": category.label,
                "count": line.count,
                "avatar_url": avatar,
                "has_avatar": bool(avatar),
            }
        )
    url = group.url or ""
    # Sections test booleans, never the strings: inside {{#url}} a renderer that resolves attributes
    # (chevron, which the tests compare against) would resolve {{title}} against the str (str.title).
    return {
        "title": entity_title(group, t),
        "url": url,
        "has_url": bool(url),
        "lines": lines,
        "summary": " · ".join(line["summary"] for line in lines),
        "count": group.count,
        "count_label": wording.updates(group.count, t),
        "entity_type": group.entity_type,
        "entity_id": group.entity_id,
    }


def headline(
    digest: Digest, items: list[dict], categories: dict[str, Category], t: i18n.Translator | None = None
) -> tuple[str, int]:
    """The top entity's top line, naming it ("Eli and 5 others followed Launch notes"), and the
    number of updates it stands for."""
    group, item = digest.groups[0], items[0]
    line = ordered_lines(group, categories)[0]
    names = [line.actors[k][1] for k in line.actor_keys()]
    category = lookup(line.category, categories, t.tag if t is not None else None)
    top = wording.headline(category, names, line.count, item["title"], t)
    return clip(top, 150), line.count


@dataclass(frozen=True)
class Reader:
    """Who a digest is for, and the links in it that are theirs."""

    name: str
    cadence: str  # the run's: immediately, hourly, daily or weekly (the words come from digest/wording.py)
    timezone: str | None
    last_digest_at: datetime | None  # when the previous digest was sent (None: this is the first one)
    unsubscribe_url: str
    preferences_url: str
    view_url: str = ""  # the hosted copy's link ("View in your browser"); empty on the hosted copy itself
    locale: str | None = None  # the subscriber's (None: DEFAULT_LOCALE)
    held: bool = False  # it waited for the end of the subscriber's quiet hours


def build(
    digest: Digest,
    reader: Reader,
    *,
    categories: dict[str, Category],
    now: datetime,
    postal_address: str | None = None,
) -> dict:
    """The template context of one digest. `postal_address`: MAIL_POSTAL_ADDRESS by default (empty in
    development/test: no line)."""
    name, cadence, last_digest_at = reader.name, reader.cadence, reader.last_digest_at
    unsubscribe_url, preferences_url, view_url = reader.unsubscribe_url, reader.preferences_url, reader.view_url
    settings = config.get()
    if postal_address is None:
        postal_address = settings.mail_postal_address
    tz = timezones.load(reader.timezone)
    t = i18n.translator(reader.locale)
    items = [group_item(g, digest, categories, now, tz, t) for g in digest.groups]
    lead = wording.lead(digest.total_events, last_digest_at, now, tz, cadence, t)
    if items:
        top, told = headline(digest, items, categories, t)
        subject_line = wording.subject(top, digest.total_events - told, t)
        others = [item["title"] for item in items[1:3]]
        preheader = clip(t.gettext("{lead} Also: {titles}", lead=lead, titles=t.join(others)) if others else lead, 150)
    else:
        top = subject_line = preheader = lead
    hello = clip(greeting.greeting(name, settings.name_fallback, t), 70)
    return {
        "lang": t.language,
        "dir": t.direction,
        "view_in_browser": t.gettext("View in your browser"),
        "change_cadence": t.gettext("Change how often you get it"),
        "unsubscribe": t.gettext("Unsubscribe"),
        "subject": "",  # filled after the subject template ran (the HTML <title>)
        "subject_line": subject_line,
        "headline": top,
        "greeting": hello,
        "heading": wording.heading(hello, cadence, t, held=reader.held),
        "reason": wording.reason(cadence, t),
        "lead": lead,
        "first_digest": last_digest_at is None,
        "preheader": preheader,
        "cadence": cadence,
        "groups": items,
        "has_more": digest.more_groups > 0,
        "more_groups": digest.more_groups,
        "more": wording.more(
            digest.more_events, digest.more_groups, {humanise(k).lower() for k in digest.more_kinds}, t
        )
        if digest.more_groups
        else "",
        "total_groups": digest.total_groups,
        "total_events": digest.total_events,
        "unsubscribe_url": unsubscribe_url,
        "preferences_url": preferences_url,
        "postal_address": postal_address,
        "has_postal_address": bool(postal_address),
        "view_url": view_url,
        "has_view_url": bool(view_url),
    }
