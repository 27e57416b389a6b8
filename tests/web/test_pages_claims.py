"""Unsubscribe through the pages is effective before the next claim, and the links that really
leave in mail (List-Unsubscribe header, preferences link) land on working pages."""

from __future__ import annotations

import re

import pytest

from app.platform import db, tokens
from app.platform.providers.base import Provider, SendResult
from digest import send as digest_sender_module
from tests import factories, newsletter_support


@pytest.fixture
def support():
    return newsletter_support


@pytest.fixture
def digest_sender():
    return digest_sender_module


class RecordingProvider(Provider):
    name = "recording"
    max_batch = 100

    def __init__(self):
        self.sent = []

    def send_batch(self, mails, progress=None):
        self.sent.extend(mails)
        return [SendResult(ok=True, message_id=f"m-{m.idempotency_key}") for m in mails]


def _path(url: str) -> str:
    return re.sub(r"^https?://[^/]+", "", url)


def test_one_click_unsubscribe_after_outbox_is_built_skips_the_claim(client, redis_client, support):
    factories.seed_subscribers(3)
    newsletter_id = factories.newsletter()
    support.start(newsletter_id)  # outbox rows exist for all three, pending
    assert support.counts(newsletter_id) == {"pending": 3}

    gone = db.query("SELECT id FROM subscribers WHERE user_id = 'u2'")[0][0]
    r = client.post("/u/" + tokens.make("unsubscribe", gone, 1), data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200
    assert db.query("SELECT unsubscribed_at IS NOT NULL FROM subscribers WHERE id = %s", (gone,))[0][0]

    provider = RecordingProvider()
    support.drain(newsletter_id, provider)
    assert sorted(m.to for m in provider.sent) == ["user1@example.com", "user3@example.com"]
    status = db.query("SELECT status FROM email_log WHERE subscriber_id = %s", (gone,))[0][0]
    assert status == "suppressed"


def test_links_in_a_sent_newsletter_open_the_pages_and_one_click_works(client, redis_client, support):
    factories.seed_subscribers(1)
    newsletter_id = factories.newsletter()
    support.start(newsletter_id)
    provider = RecordingProvider()
    support.drain(newsletter_id, provider)
    (mail,) = provider.sent

    header = mail.headers.get("List-Unsubscribe", "")
    https_url = re.search(r"<(https?://[^>]+)>", header)
    assert https_url, f"no http(s) List-Unsubscribe URL in {header!r}"
    assert mail.headers.get("List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    unsubscribe = _path(https_url.group(1))
    preferences = re.search(r'href="([^"]*/preferences/[^"]+)"', mail.html)
    assert preferences, "no preferences link in the mail body"

    assert client.get(_path(preferences.group(1))).status_code == 200
    assert client.get(unsubscribe).status_code == 200
    r = client.post(
        unsubscribe,
        content=b"List-Unsubscribe=One-Click",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert r.status_code == 200
    # A newsletter's one-click stops the newsletter stream only (issue 11 item 10: streams).
    assert db.query(
        "SELECT newsletters_unsubscribed_at IS NOT NULL, unsubscribed_at IS NULL, digest_cadence FROM subscribers"
    ) == [(True, True, "daily")]


# ---------------------------------------------------------------- digest runs


def _run(run_id: int) -> tuple:
    return tuple(db.query("SELECT status, skip_reason FROM digest_runs WHERE id = %s", (run_id,))[0])


def test_digest_run_claimed_after_one_click_is_skipped(client, digest_sender):
    sid = factories.subscriber("d1", "d1@example.com")
    factories.category_events("d1", "likes")
    r = client.post("/u/" + tokens.make("unsubscribe", sid, 1), data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200
    run_id = factories.digest_run(sid)  # a run the planner inserted just before it saw the unsubscribe
    provider = RecordingProvider()
    digest_sender.process(run_ids=[run_id], provider=provider)
    assert provider.sent == []
    assert _run(run_id) == ("skipped", "unsubscribed")


def test_pause_from_preference_centre_skips_the_next_claim(client, digest_sender):
    sid = factories.subscriber("d1", "d1@example.com")
    factories.category_events("d1", "likes")
    path = "/preferences/" + tokens.make("preferences", sid, 1)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text).group(1)
    form = {
        "csrf_token": csrf,
        "action": "save",
        "digest_cadence": "daily",
        "digest_hour": "9",
        "digest_weekday": "0",
        "timezone": "UTC",
        "pause_days": "3",
    }
    assert client.post(path, data=form, follow_redirects=False).status_code == 303
    run_id = factories.digest_run(sid)
    provider = RecordingProvider()
    digest_sender.process(run_ids=[run_id], provider=provider)
    assert provider.sent == [] and _run(run_id) == ("skipped", "paused")


def test_topic_opted_out_on_the_page_is_left_out_of_the_digest(client, digest_sender):
    sid = factories.subscriber("d1", "d1@example.com")
    factories.category_events("d1", "likes", "comments")
    path = "/preferences/" + tokens.make("preferences", sid, 1)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text).group(1)
    form = {
        "csrf_token": csrf,
        "action": "save",
        "digest_cadence": "daily",
        "digest_hour": "9",
        "digest_weekday": "0",
        "timezone": "UTC",
        "shown_category": ["likes", "comments"],
        "category": ["likes"],
    }
    assert client.post(path, data=form, follow_redirects=False).status_code == 303
    run_id = factories.digest_run(sid)
    provider = RecordingProvider()
    digest_sender.process(run_ids=[run_id], provider=provider)
    (mail,) = provider.sent
    assert _run(run_id)[0] == "sent"
    # One event read into the digest: the likes one (the comments one is covered by its mark, unread).
    assert db.query("SELECT event_count FROM digest_runs WHERE id = %s", (run_id,)) == [(1,)]
    assert mail.headers.get("List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    unsubscribe = _path(re.search(r"<(https?://[^>]+)>", mail.headers["List-Unsubscribe"]).group(1))
    assert client.post(unsubscribe, files={"List-Unsubscribe": (None, "One-Click")}).status_code == 200
    # A digest's one-click stops the digest stream only (issue 11 item 10: streams).
    assert db.query(
        "SELECT digest_cadence, unsubscribed_at IS NULL, newsletters_unsubscribed_at IS NULL "
        "FROM subscribers WHERE id = %s",
        (sid,),
    ) == [("off", True, True)]
