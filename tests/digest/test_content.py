"""What a digest says, through the real pipeline (Postgres, the SMTP sink): titles and links from
the best event, tracked links in both parts, no self-activity, honest "first"/"since" wording,
registered category labels."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.platform import config, db
from app.subscribers import categories
from digest import build as digest_build
from digest import send as digest_send
from digest import wording
from scripts import demo_data
from tests import factories
from tests.digest_support import marked, run_row, sink_as_provider


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def parts(msg) -> tuple[str, str]:
    return (msg.get_body(("html",)).get_content(), msg.get_body(("plain",)).get_content().replace("\r\n", "\n"))


def test_title_link_and_avatar_come_from_the_newest_event_carrying_each(sink):
    sid = factories.subscriber("u1")
    factories.events(
        "u1",
        1,
        entity_id="p9",
        actor="eli",
        actor_name="Eli",
        payload={
            "entity_title": "Launch notes",
            "entity_url": "https://app.test/p/9",
            "actor_avatar_url": "https://cdn.test/eli.png",
        },
    )
    factories.events("u1", 1, entity_id="p9", actor="bo", actor_name="Bo", payload={"note": "no title here"})
    factories.events(
        "u1",
        1,
        entity_id="p9",
        actor="eli",
        actor_name="Eli",
        payload={"entity_url": "javascript:alert(1)", "title": 42, "actor_avatar_url": "ftp://x/e.png"},
    )
    digest_send.process([factories.digest_run(sid)])
    html, text = parts(sink.messages()[0])
    assert "Launch notes" in html and "post p9" not in html.lower()
    assert '<a href="https://app.test/p/9"' in html and "javascript:" not in html and "ftp://" not in html
    assert 'src="https://cdn.test/eli.png"' in html  # Eli leads the line: his avatar
    assert "* Launch notes\n  https://app.test/p/9\n" in text


def test_a_title_sent_only_with_the_oldest_of_many_events_is_still_found(sink):
    sid = factories.subscriber("u1")
    factories.events("u1", 1, entity_id="p1", payload={"entity_title": "Old but gold"})
    factories.events("u1", 12, entity_id="p1", payload={"other": 1})
    digest_send.process([factories.digest_run(sid)])
    assert "* Old but gold\n" in parts(sink.messages()[0])[1]


def test_links_are_tracked_in_both_parts(sink, settings):
    settings(tracking=True)
    sid = factories.subscriber("u1")
    factories.events("u1", 2, payload={"entity_title": "Post", "entity_url": "https://example.test/post/1"})
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    html, text = parts(sink.messages()[0])
    assert "https://example.test/post/1" not in html and "https://example.test/post/1" not in text
    (_link_id,) = db.query("SELECT id FROM email_links WHERE mail_id = %s", (rid,))[0]
    click = html.split('<p class="item-title"')[1].split('href="')[1].split('"')[0]
    assert "/c/" in click and f"  {click}\n" in text  # the same click URL in the text part


def test_own_activity_is_never_shown_and_is_marked(sink):
    sid = factories.subscriber("u1", name="Ana Lima")
    own = factories.events("u1", 2, entity_id="p1", actor="u1", actor_name="Ana")
    # Ana published p2 (her own event, carrying its title); Bo liked it
    own += factories.events(
        "u1", 1, entity_id="p2", actor="u1", actor_name="Ana", payload={"entity_title": "Launch notes"}
    )
    others = factories.events("u1", 1, entity_id="p2", actor="bo", actor_name="Bo", payload={"x": 1})
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    _html, text = parts(sink.messages()[0])
    assert "Ana" not in text.split("\n", 1)[1] and "Post p1" not in text and "Bo" in text
    assert "* Launch notes\n  - Like from Bo (" in text
    assert "Your first digest: 1 update." in text
    assert set(marked(own + others).values()) == {rid} and run_row(rid)["event_count"] == 4


def test_a_run_with_only_own_activity_is_skipped_and_its_events_do_not_pile_up(sink):
    sid = factories.subscriber("u1")
    own = factories.events("u1", 3, actor="u1")
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["skipped"] == 1
    row = run_row(rid)
    assert (row["status"], row["skip_reason"]) == ("skipped", "only own activity") and sink.messages() == []
    assert set(marked(own).values()) == {rid}  # handled: never loaded again
    later = factories.digest_run(sid, period=datetime.now(UTC).date() + timedelta(days=1))
    assert digest_send.process([later])["skipped"] == 1 and run_row(later)["skip_reason"] == "no events"


def test_first_digest_then_since_the_previous_one(sink):
    sid = factories.subscriber("u1", timezone="Asia/Tokyo")
    factories.events("u1", 2)
    first = factories.digest_run(sid, period=datetime.now(UTC).date() - timedelta(days=3))
    digest_send.process([first])
    assert "Your first digest: 2 updates." in parts(sink.messages()[0])[1]
    # the previous digest went out three days ago (a weekly one: any cadence counts)
    sent_at = datetime.now(UTC) - timedelta(days=3)
    db.query("UPDATE digest_runs SET completed_at = %s, cadence = 'weekly' WHERE id = %s", (sent_at, first))
    factories.events("u1", 1, entity_id="p2")
    digest_send.process([factories.digest_run(sid)])
    text = parts(sink.messages()[1])[1]
    expected = wording.since(sent_at, datetime.now(UTC), ZoneInfo("Asia/Tokyo"))
    assert f"1 update {expected}." in text and "first" not in text


def test_registered_labels_and_verbs_name_the_lines_and_the_subject(sink):
    categories.upsert("follow", {"label": "Follows", "description": "", "verb": "followed", "delivery": "digest"})
    categories.upsert("comment", {"label": "Comments", "description": "", "verb": "commented on", "delivery": "digest"})
    sid = factories.subscriber("u1")
    factories.events("u1", 6, entity_id="p1", category="follow", payload={"entity_title": "Launch notes"})
    factories.events("u1", 1, entity_id="p1", category="comment", actor="gus", actor_name="Gus", payload={"x": 1})
    factories.events("u1", 1, entity_id="p1", category="like", actor="fay", actor_name="Fay", payload={"x": 1})
    for i in range(8):
        factories.events("u1", 1, entity_id=f"other-{i}")
    digest_send.process([factories.digest_run(sid)])
    msg = sink.messages()[0]
    assert msg["Subject"] == "Actor a5, Actor a4 and 4 others followed Launch notes — and 10 more updates"
    text = parts(msg)[1]
    block = text.split("* Launch notes\n")[1].split("\n\n")[0]
    assert [line.split(" (")[0] for line in block.splitlines()] == [
        "  - Actor a5, Actor a4 and 4 others followed",
        "  - Like from Fay",
        "  - Gus commented",
    ]  # ties: newest first


def test_preview_uses_the_same_wording(sink):
    factories.subscriber("u1")
    factories.events("u1", 1, actor="u1")
    assert digest_build.preview("u1") is None  # only own activity: nothing to show
    factories.events("u1", 1, actor="bo", actor_name="Bo", payload={"entity_title": "Hello"})
    rendered = digest_build.preview("u1")
    assert rendered.subject == "Like from Bo on Hello" and "Your first digest: 1 update." in rendered.text


def test_a_send_now_category_event_the_send_now_path_has_not_sent_goes_in_the_digest(sink):
    categories.upsert("alert", {"label": "Alerts", "description": "", "verb": "", "delivery": "immediate"})
    sid = factories.subscriber("u1")
    ids = factories.events("u1", 1, category="alert", actor="bo", actor_name="Bo")
    rid = factories.digest_run(sid)
    digest_send.process([rid])
    assert "Alerts from Bo" in parts(sink.messages()[0])[1] and set(marked(ids).values()) == {rid}


def test_other_processes_see_a_registry_change_within_the_cache_time(monkeypatch):
    assert categories.registry() == {}
    # another process registers a category: this one's snapshot is still fresh ...
    db.query("INSERT INTO categories (key, label) VALUES ('comment', 'Comments')")
    assert categories.registry() == {}
    # ... until CACHE_SECONDS have passed
    monkeypatch.setattr(categories, "CACHE_SECONDS", 0)
    assert categories.registry()["comment"].label == "Comments"


def test_the_demo_has_avatars_urgent_events_and_every_cadence(sink):
    """`make run` shows what issue 11 promises: avatars, a high-priority event, a "send now"
    category with an event in it, hourly and immediately subscribers (scripts/demo_data.py)."""
    demo_data.load()
    [(events, avatars, high)] = db.query(
        "SELECT count(*), count(*) FILTER (WHERE payload->>'actor_avatar_url' LIKE %s), "
        "count(*) FILTER (WHERE high_priority) FROM digest_events WHERE source = 'demo'",
        (config.get().base_url + "/static/avatar-%",),  # served by the web app (issue 22.7)
    )
    assert avatars == events > 0 and high >= 1
    send_now = categories.send_now_keys(categories.registry())
    assert send_now and db.query("SELECT 1 FROM digest_events WHERE category = ANY (%s)", (send_now,))
    cadences = {c for (c,) in db.query("SELECT digest_cadence FROM subscribers WHERE user_id LIKE 'demo-%%'")}
    assert {"hourly", "immediately", "daily"} <= cadences
    assert db.query("SELECT count(*) FROM digest_send_now")[0][0] >= 2  # the urgent events wait to go now
    rendered = digest_build.preview("demo-ana")
    assert demo_data.avatar_url("Gus").replace("&", "&amp;") in rendered.html


def test_the_demo_shows_titles_links_and_labels_and_nobody_their_own_activity(sink):
    demo_data.load()
    for user_id, *_ in demo_data.DEMO_USERS:
        rendered = digest_build.preview(user_id)
        titles = [title for _, title in demo_data.POSTS]
        assert any(f"* {title}\n  https://example.test/posts/" in rendered.text for title in titles)
        assert "Post post-" not in rendered.text  # every block has its title
        assert any(verb in rendered.text for verb in (" liked", " followed", " commented"))
        assert "Like from" not in rendered.text and "Follow from" not in rendered.text  # registered labels
        own_name = dict(demo_data.ACTORS)[user_id]
        assert f" {own_name} " not in rendered.text.split("\n", 1)[1].replace(",", " ")
        assert rendered.subject.split(" — ")[0].endswith(tuple(titles))


def test_the_html_part_is_ascii_7bit_and_reads_back_as_the_names_and_titles_sent(sink):
    """Digest HTML writes non-ASCII text as character references (app/mail.ascii_html) so it goes
    as 7bit, not quoted-printable; a reader sees exactly the names and titles of the events."""
    import html as html_lib

    sid = factories.subscriber("u1", name="Zoë")
    factories.events(
        "u1",
        2,
        entity_id="p1",
        actor="jo",
        actor_name="Jürgen 😀",
        payload={"entity_title": "Grüße aus Köln — «Launch»", "entity_url": "https://app.test/ü?q=1"},
    )
    digest_send.process([factories.digest_run(sid)])
    msg = sink.messages()[0]
    html_part = msg.get_body(("html",))
    assert html_part["Content-Transfer-Encoding"] == "7bit"
    html = html_part.get_content()
    assert html.isascii()
    shown = html_lib.unescape(html)
    assert "Hi Zoë" in shown and "Jürgen 😀" in shown and "Grüße aus Köln — «Launch»" in shown
    assert "Grüße aus Köln — «Launch»" in msg["Subject"]
    assert msg.get_body(("plain",))["Content-Transfer-Encoding"] == "quoted-printable"  # the text part is not ASCII
    assert "Jürgen 😀" in parts(msg)[1]
