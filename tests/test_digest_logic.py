"""Pure digest logic: grouping, ranking, actor aggregation, cap, context, escaping."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from digest import context, group

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

T0 = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)


def ev(i, entity="p1", actor="a", name=None, category="like", minutes=0):
    return group.Event(i, category, "post", entity, actor, name if name is not None else actor.upper(),
                       T0 + timedelta(minutes=minutes))


def test_groups_by_category_entity_and_ranks_by_count():
    events = [ev(1, "p1"), ev(2, "p2"), ev(3, "p2"), ev(4, "p3"), ev(5, "p2"), ev(6, "p1"),
              ev(7, "p1", category="comment")]
    d = group.build(events, max_items=10)
    assert [(g.key, g.count) for g in d.groups][:2] == [(("like", "post", "p2"), 3), (("like", "post", "p1"), 2)]
    assert d.total_groups == 4 and d.total_events == 7 and d.more_groups == 0
    assert sorted(d.event_ids) == [1, 2, 3, 4, 5, 6, 7]


def test_ties_rank_most_recent_first():
    events = [ev(1, "old", minutes=1), ev(2, "new", minutes=5), ev(3, "mid", minutes=3)]
    assert [g.entity_id for g in group.build(events, 10).groups] == ["new", "mid", "old"]


def test_actors_distinct_most_recent_first():
    events = [ev(1, actor="ana", minutes=1), ev(2, actor="bo", minutes=2), ev(3, actor="ana", minutes=3),
              ev(4, actor="cy", minutes=0)]
    (g,) = group.build(events, 10).groups
    assert g.actor_names() == ["ANA", "BO", "CY"]


def test_actors_text():
    assert group.actors_text([]) == ""
    assert group.actors_text(["Ana"]) == "Ana"
    assert group.actors_text(["Ana", "Bo"]) == "Ana and Bo"
    assert group.actors_text(["Ana", "Bo", "Cy"]) == "Ana, Bo and Cy"
    assert group.actors_text(["Ana", "Bo", "Cy", "Dee"]) == "Ana, Bo and 2 others"
    assert group.actors_text(["Ana", "Bo", "Cy", "Dee", "Eli"]) == "Ana, Bo and 3 others"


def test_cap_keeps_every_event_id_and_counts_the_rest():
    events = [ev(i, f"p{i % 8}", minutes=i) for i in range(40)]
    d = group.build(events, max_items=3)
    assert len(d.groups) == 3 and d.more_groups == 5 and d.total_groups == 8
    assert len(d.event_ids) == 40  # the summarised ones are marked too
    ctx = context.build(d, {}, cadence="daily", name="Ana", unsubscribe_url="https://x/u/t",
                        preferences_url="https://x/p/t")
    assert ctx["has_more"] and ctx["more_groups"] == 5 and ctx["total_events"] == 40


def test_context_uses_payload_title_and_only_http_urls():
    d = group.build([ev(1, "p1"), ev(2, "p2", minutes=1)], 10)
    payloads = {1: {"title": "Hello", "url": "javascript:alert(1)"}, 2: {"title": "World", "url": "https://ok.test/x"}}
    ctx = context.build(d, payloads, cadence="weekly", name="Ana Lima", unsubscribe_url="u", preferences_url="p")
    items = {i["title"]: i for i in ctx["groups"]}
    assert items["Hello"]["url"] == "" and not items["Hello"]["has_url"]
    assert items["World"]["url"] == "https://ok.test/x"
    assert ctx["heading"].startswith("Hi Ana,") and ctx["cadence"] == "weekly"


def test_count_label_plural():
    assert context.count_label(1, "comment") == "1 comment"
    assert context.count_label(3, "comment") == "3 comments"
    assert context.count_label(2, "likes") == "2 likes"
