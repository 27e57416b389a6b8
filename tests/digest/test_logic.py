"""Pure digest logic: entity-first grouping, ranking, actor aggregation, own activity, cap,
titles/links/avatars from the best event, wording (times, "since", subject), context, escaping."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.platform import urls
from app.subscribers import categories
from app.subscribers.categories import Category
from digest import context, details, group, wording

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)  # a Sunday
UTC_ZONE = ZoneInfo("UTC")
FOLLOW = Category("follow", "Follows", verb="followed")
COMMENT = Category("comment", "Comments", verb="commented on")
REGISTRY = {"follow": FOLLOW, "comment": COMMENT, "like": Category("like", "Likes")}


def ev(i, entity="p1", actor="a", name=None, category="like", minutes=0):
    return group.Event(
        i,
        category,
        "post",
        entity,
        actor,
        name if name is not None else (actor or "").upper(),
        T0 + timedelta(minutes=minutes),
    )


def ctx_of(d, now=T0 + timedelta(hours=2), last=None, tz="UTC", registry=REGISTRY):
    return context.build(
        d,
        context.Reader(
            name="Ana Lima",
            cadence="daily",
            timezone=tz,
            last_digest_at=last,
            unsubscribe_url="https://x.test/u/t",
            preferences_url="https://x.test/preferences/t",
        ),
        categories=registry,
        now=now,
        postal_address="",
    )


# ---------------------------------------------------------------- grouping and ranking


def test_one_block_per_entity_with_one_line_per_category():
    events = [
        ev(1, "p1", "eli", category="follow"),
        ev(2, "p1", "bo", category="follow", minutes=1),
        ev(3, "p1", "fay", category="like", minutes=2),
        ev(4, "p1", "gus", category="comment", minutes=3),
        ev(5, "p2", "eli", category="like"),
    ]
    d = group.build(events, max_items=10)
    assert [g.key for g in d.groups] == [("post", "p1"), ("post", "p2")]
    p1 = d.groups[0]
    assert [(line.category, line.count) for line in p1.ranked_lines()] == [("follow", 2), ("comment", 1), ("like", 1)]
    assert p1.count == 4 and p1.latest_event_id == 4
    assert d.total_groups == 2 and d.total_events == 5 and d.more_groups == 0
    assert sorted(d.event_ids) == [1, 2, 3, 4, 5]


def test_score_counts_distinct_actor_category_pairs_not_repeats():
    # p1: Eli liked ten times (score 1). p2: Bo and Cy liked (2). p3: Dee liked and commented (2),
    # more recent than p2. p4: three likes without an actor (3).
    events = [ev(i, "p1", "eli") for i in range(1, 11)]
    events += [ev(11, "p2", "bo"), ev(12, "p2", "cy")]
    events += [ev(13, "p3", "dee", minutes=5), ev(14, "p3", "dee", category="comment", minutes=5)]
    events += [ev(15 + i, "p4", None, name="") for i in range(3)]
    d = group.build(events, 10)
    assert [(g.entity_id, g.score) for g in d.groups] == [("p4", 3), ("p3", 2), ("p2", 2), ("p1", 1)]


def test_ties_rank_most_recent_first():
    events = [ev(1, "old", minutes=1), ev(2, "new", minutes=5), ev(3, "mid", minutes=3)]
    assert [g.entity_id for g in group.build(events, 10).groups] == ["new", "mid", "old"]


def test_actors_distinct_most_recent_first():
    events = [
        ev(1, actor="ana", minutes=1),
        ev(2, actor="bo", minutes=2),
        ev(3, actor="ana", minutes=3),
        ev(4, actor="cy", minutes=0),
    ]
    (g,) = group.build(events, 10).groups
    (line,) = g.ranked_lines()
    assert line.actor_names() == ["ANA", "BO", "CY"] and line.count == 4 and line.score == 3


def test_own_activity_is_never_shown_but_handled():
    events = [ev(1, "p1", "u-ana"), ev(2, "p1", "bo"), ev(3, "p2", "u-ana"), ev(4, "p2", "u-ana", category="comment")]
    d = group.build(events, 10, recipient="u-ana")
    assert [g.entity_id for g in d.groups] == ["p1"]
    assert d.groups[0].ranked_lines()[0].actor_names() == ["BO"]
    assert d.own_events == 3 and d.total_events == 1
    assert sorted(d.event_ids) == [1, 2, 3, 4]  # all marked with the run
    # their events still tell the shown entity's title and link (e.g. "Ana published Launch notes")
    assert sorted(e.id for e in d.groups[0].events) == [1, 2] and d.groups[0].count == 1
    only_own = group.build([ev(1, actor="u-ana")], 10, recipient="u-ana")
    assert only_own.empty and only_own.event_ids == [1]


def test_cap_counts_entities_and_keeps_every_event_id():
    events = [ev(i, f"p{i % 8}", actor=f"a{i}", minutes=i) for i in range(40)]
    d = group.build(events, max_items=3)
    assert len(d.groups) == 3 and d.more_groups == 5 and d.total_groups == 8
    assert len(d.event_ids) == 40  # the summarised ones are marked too
    ctx = ctx_of(d)
    assert ctx["has_more"] and ctx["more_groups"] == 5 and ctx["total_events"] == 40
    # One unit everywhere, updates (events): the headline's 5, 35 more, 40 in the lead; the tail
    # names the 5 entities left out and their 25 updates.
    assert ctx["subject_line"].endswith("— and 35 more updates") and ctx["lead"] == "Your first digest: 40 updates."
    assert ctx["more"] == "…and 25 more updates on 5 other posts"


# ---------------------------------------------------------------- titles, links, avatars


def test_newest_event_carrying_a_value_wins_per_field():
    # rows in details.KEYS order: entity_title, title, entity_url, url, actor_avatar_url; newest first
    rows = [
        (None, " ", "javascript:alert(1)", None, "ftp://x/a.png"),  # no usable value
        (None, "Older title key", None, "https://ok.test/7", "https://ok.test/a.png"),
        ("Launch notes", None, "https://ok.test/5", None, None),
    ]
    assert details.entity_fields(rows[:1]) == (None, "")
    assert details.entity_fields(rows) == ("Older title key", "https://ok.test/7")
    assert details.entity_fields(rows[2:], title="Found before") == ("Found before", "https://ok.test/5")
    # within one event the documented key wins
    assert details.entity_fields([("Documented", "Legacy", "https://a.test/", "https://b.test/", None)]) == (
        "Documented",
        "https://a.test/",
    )
    assert details.avatar(rows) == "https://ok.test/a.png" and details.avatar(rows[2:]) == ""


def test_newest_means_latest_occurred_at_then_id():
    events = [
        ev(1, "p1", "bo", minutes=5),
        ev(2, "p1", "cy", minutes=1),
        ev(3, "p1", "u-ana", minutes=9),
        ev(4, "p1", "dee", minutes=5),
    ]
    d = group.build(events, 10, recipient="u-ana")
    assert group.newest_ids(d.groups[0].events) == [3, 4, 1, 2]  # the subscriber's own events included
    assert details._newest(d.groups[0].events) == 3


def test_only_http_urls_are_links():
    assert urls.http_url("https://ok.test/x?a=1&b=2") == "https://ok.test/x?a=1&b=2"
    assert urls.http_url(" HTTP://ok.test/ ") == "HTTP://ok.test/"
    for bad in (
        "javascript:alert(1)",
        "data:text/html,x",
        "/relative",
        "//host/x",
        "https://",
        "ftp://x",
        'https://x.test/"onmouseover=1',
        "https://x .test",
        "https://x.test/\x00",
        5,
        None,
        "https://x.test/" + "a" * 2000,
        "https://x.test/a\x85b",
        "https://x.test/a\x1cb",
        "https://x.test/a\u00a0b",
        "https://x.test/a\u2028b",
        "https://x.test/a\ufeffb",
    ):
        assert urls.http_url(bad) == "", bad


def test_url_pattern_uses_explicit_classes_only():
    """The same pattern is the OpenAPI document's (ECMA-262) and the server's (Python re): their \\s,
    \\w and \\d differ (Python's \\s matches U+0085, ECMA's does not), so none may appear."""
    from app.platform import validation

    for pattern in (urls.PATTERN, validation.NOT_BLANK, categories._LABEL):
        assert not any(escape in pattern for escape in ("\\s", "\\S", "\\w", "\\W", "\\d", "\\D")), pattern


def test_not_blank_means_what_strip_removes():
    from app.platform import validation

    not_blank = re.compile(validation.NOT_BLANK)
    for c in map(chr, range(0x3100)):
        assert (not_blank.fullmatch(c) is None) == (c.isspace() or c == "\x00"), hex(ord(c))


def test_context_title_url_and_avatar():
    d = group.build([ev(1, "p1", "eli", category="follow"), ev(2, "p2", "bo", minutes=1)], 10)
    _p2, p1 = d.groups
    p1.title, p1.url = "Launch <notes>", "https://ok.test/p1"
    d.avatars["eli"] = "https://ok.test/eli.png"
    items = {i["entity_id"]: i for i in ctx_of(d)["groups"]}
    assert items["p1"]["title"] == "Launch <notes>" and items["p1"]["has_url"]
    assert items["p1"]["lines"][0]["avatar_url"] == "https://ok.test/eli.png"
    assert items["p2"]["title"] == "Post p2" and not items["p2"]["has_url"]  # no title: type and id
    assert not items["p2"]["lines"][0]["has_avatar"]


def test_titles_are_clipped_to_one_line_without_control_characters():
    assert context.clip("a\nb\tc\x07d") == "a b cd"
    assert context.clip("x" * 300, 10) == "x" * 9 + "…"


# ---------------------------------------------------------------- wording


def test_actors_text():
    assert wording.actors_text([]) == ""
    assert wording.actors_text(["Ana"]) == "Ana"
    assert wording.actors_text(["Ana", "Bo"]) == "Ana and Bo"
    assert wording.actors_text(["Ana", "Bo", "Cy"]) == "Ana, Bo and Cy"
    assert wording.actors_text(["Ana", "Bo", "Cy", "Dee"]) == "Ana, Bo and 2 others"
    assert wording.actors_text(["Ana", "Bo", "Cy", "Dee", "Eli"]) == "Ana, Bo and 3 others"


def test_line_text_with_and_without_a_registered_verb():
    five = ["Eli", "Bo", "Cy", "Dee", "Fay"]
    assert wording.line_text(FOLLOW, five, 5) == "Eli, Bo and 3 others followed"
    assert wording.line_text(COMMENT, ["Gus"], 4) == "Gus commented 4 times"
    assert wording.line_text(Category("like", "Likes"), ["Eli", "Bo"], 2) == "Likes from Eli and Bo"
    assert wording.line_text(Category("like", "Likes"), ["Gus"], 4) == "Likes from Gus (4)"
    assert wording.line_text(Category("like", "Likes"), [], 3) == "Likes (3)"
    assert wording.line_text(categories.unknown("new_comment"), ["Gus"], 1) == "New comment from Gus"
    assert wording.block_verb("mentioned you in") == "mentioned you" and wording.block_verb("liked") == "liked"


def test_subject_names_the_top_entity():
    top = wording.headline(FOLLOW, ["Eli", "Bo", "Cy", "Dee", "Fay", "Gus"], 6, "Launch notes")
    assert wording.subject(top, 8) == "Eli, Bo and 4 others followed Launch notes — and 8 more updates"
    assert (
        wording.subject(wording.headline(COMMENT, ["Gus"], 1, "Launch notes"), 1)
        == "Gus commented on Launch notes — and 1 more update"
    )
    assert wording.subject(wording.headline(Category("x", "Likes"), [], 3, "T"), 0) == "Likes (3) on T"


def test_context_subject_and_lines_from_the_registry():
    events = [
        ev(i, "p1", f"a{i}", name=n, category="follow", minutes=i)
        for i, n in enumerate(["Gus", "Fay", "Dee", "Cy", "Bo", "Eli"])
    ]
    events += [ev(10, "p1", "fay", name="Fay", category="like", minutes=20), ev(11, "p2", "x", minutes=1)]
    d = group.build(events, 10)
    d.groups[0].title = "Launch notes"
    ctx = ctx_of(d)
    # the headline stands for the 6 follows; the like and p2's update are the 2 more (8 in the lead)
    assert ctx["subject_line"] == "Eli, Bo and 4 others followed Launch notes — and 2 more updates"
    lines = ctx["groups"][0]["lines"]
    assert [line["summary"] for line in lines] == ["Eli, Bo and 4 others followed", "Likes from Fay"]
    assert [line["label"] for line in lines] == ["Follows", "Likes"]
    unregistered = ctx_of(d, registry={})["groups"][0]["lines"]
    assert [line["summary"] for line in unregistered] == ["Follow from Eli, Bo and 4 others", "Like from Fay"]


def test_relative_times_in_the_subscribers_zone():
    now = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)  # Thursday 10:00 UTC
    tokyo = ZoneInfo("Asia/Tokyo")  # Thursday 19:00 there
    assert wording.relative_time(now - timedelta(seconds=20), now, UTC_ZONE) == "just now"
    assert wording.relative_time(now + timedelta(minutes=5), now, UTC_ZONE) == "just now"  # producer clock skew
    assert wording.relative_time(now - timedelta(minutes=5), now, UTC_ZONE) == "5 min ago"
    assert wording.relative_time(now - timedelta(hours=2, minutes=59), now, UTC_ZONE) == "2 h ago"
    # 14 h earlier is still Thursday in Tokyo (05:00), but Wednesday 20:00 in UTC
    assert wording.relative_time(now - timedelta(hours=14), now, tokyo) == "14 h ago"
    assert wording.relative_time(now - timedelta(hours=14), now, UTC_ZONE) == "yesterday 20:00"
    assert wording.relative_time(now - timedelta(days=3), now, tokyo) == "Monday 19:00"
    assert wording.relative_time(now - timedelta(days=10), now, UTC_ZONE) == "23 Feb"
    assert wording.relative_time(now - timedelta(days=400), now, UTC_ZONE) == "29 Jan 2025"


def test_since_the_previous_digest():
    now = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)  # Thursday
    lisbon = ZoneInfo("Europe/Lisbon")
    assert wording.since(now - timedelta(hours=1), now, UTC_ZONE) == "since 09:00"
    assert wording.since(now - timedelta(days=1), now, lisbon) == "since yesterday"
    assert wording.since(now - timedelta(days=2), now, lisbon) == "since Tuesday"
    assert wording.since(now - timedelta(days=9), now, UTC_ZONE) == "since 24 February"
    assert wording.since(datetime(2025, 12, 30, tzinfo=UTC), now, UTC_ZONE) == "since 30 December 2025"
    # 23:30 UTC on Tuesday is already Wednesday in Tokyo
    assert wording.since(datetime(2026, 3, 3, 23, 30, tzinfo=UTC), now, ZoneInfo("Asia/Tokyo")) == "since yesterday"


def test_first_digest_and_later_ones_are_worded_honestly():
    d = group.build([ev(1, "p1", "eli"), ev(2, "p2", "bo")], 10)
    now = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)
    first = ctx_of(d, now=now)
    assert first["first_digest"] and first["lead"] == "Your first digest: 2 updates."
    later = ctx_of(d, now=now, last=now - timedelta(days=2))
    assert not later["first_digest"] and later["lead"] == "2 updates since Tuesday."
    assert "since your last digest" not in later["lead"]


def test_context_heading_and_cadence():
    d = group.build([ev(1, "p1")], 10)
    ctx = context.build(
        d,
        context.Reader(
            name="Ana Lima",
            cadence="weekly",
            timezone="Nowhere/Bogus",
            last_digest_at=None,
            unsubscribe_url="u",
            preferences_url="p",
        ),
        categories={},
        now=T0,
        postal_address="",
    )
    assert ctx["heading"].startswith("Hi Ana,") and ctx["cadence"] == "weekly"  # a bad zone falls back to UTC


def test_humanised_category_keys():
    assert categories.humanise("likes") == "Likes"
    assert categories.humanise("new_comment") == "New comment"
    assert categories.humanise("pr.review-requested") == "Pr review requested"
    assert categories.humanise("___") == "___"
    assert categories.lookup("follow", REGISTRY) is FOLLOW
    assert categories.lookup("nope", REGISTRY).label == "Nope"


def test_category_keys_and_bodies_are_validated():
    assert categories.valid_key("comment") and categories.valid_key("pr.review-requested:v2")
    for bad in ("", "a b", "é", "x" * 101, "a/b", "<b>", None, 5):
        assert not categories.valid_key(bad), bad
    values, errors = categories.validate({"label": "  Comments  ", "verb": "commented on"})
    assert not errors and values == {
        "label": "Comments",
        "description": "",
        "verb": "commented on",
        "delivery": "digest",
        "translations": {},
    }
    _, errors = categories.validate({"label": " ", "delivery": "later", "verb": "a\nb", "extra": 1})
    assert {e["field"] for e in errors} == {"label", "delivery", "verb", "extra"}


def test_within_an_entity_what_cannot_wait_comes_first():
    """Issue 22.6: an urgent mention led by its entity, not trailing it: a line with a high-priority
    event first, and a "send now" category's line before the ordinary ones."""
    busy = [ev(i, "p1", f"a{i}", category="follow", minutes=i) for i in range(5)]
    high = ev(9, "p1", "gus", name="Gus", category="comment", minutes=1)._replace(high_priority=True)
    d = group.build([*busy, high], 10)
    assert [line.category for line in d.groups[0].ranked_lines()] == ["comment", "follow"]
    ctx = ctx_of(d)
    assert ctx["groups"][0]["lines"][0]["summary"] == "Gus commented" and ctx["headline"].startswith("Gus commented on")
    mention = Category("mention", "Mentions", verb="mentioned you in", delivery="immediate")
    d = group.build([*busy, ev(9, "p1", "gus", name="Gus", category="mention", minutes=1)], 10)
    lines = ctx_of(d, registry={**REGISTRY, "mention": mention})["groups"][0]["lines"]
    assert [line["category"] for line in lines] == ["mention", "follow"]


def test_cadences_have_the_names_a_person_uses():
    """Issue 22.6: no "instant digest"; the footer says why the mail came in the same words."""
    d = group.build([ev(1, "p1")], 10)
    now_ctx = context.build(
        d,
        context.Reader(
            name="",
            cadence="immediately",
            timezone="UTC",
            last_digest_at=None,
            unsubscribe_url="u",
            preferences_url="p",
        ),
        categories={},
        now=T0,
        postal_address="",
    )
    assert now_ctx["heading"] == "Hi, here is what's new" and "instant" not in str(now_ctx)
    assert now_ctx["lead"] == "1 update." and "digest" not in now_ctx["lead"]
    assert now_ctx["reason"] == "You get this email because you have an account with notifications turned on."
    assert wording.reason("weekly").startswith("You get this weekly digest because")
    assert wording.cadence_name("immediately") == "as it happens" and wording.cadence_name("hourly") == "hourly digest"
    assert [wording.plural(n) for n in ("post", "story", "branch", "day")] == ["posts", "stories", "branches", "days"]
    assert wording.things(1, {"issue"}) == "1 other issue" and wording.things(2, {"post", "issue"}) == "2 other items"
