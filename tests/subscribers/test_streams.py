"""Streams: a mail's one-click List-Unsubscribe stops that mail's stream only (digests or
newsletters); the page behind the link also offers "everything"; old tokens keep their meaning."""

from __future__ import annotations

import re
from datetime import date
from urllib.parse import urlsplit

import pytest
from starlette.testclient import TestClient

from app.platform import db, tokens
from app.subscribers import streams
from digest import send as digest_send
from tests import factories
from tests.digest_support import sink_as_provider
from tests.newsletter_support import counts, drain, start

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def state(subscriber_id: int) -> dict:
    cols = (
        "digest_cadence",
        "digest_cadence_before_off",
        "newsletters_unsubscribed_at",
        "unsubscribed_at",
        "category_opt_outs",
    )
    return dict(zip(cols, db.query(f"SELECT {', '.join(cols)} FROM subscribers WHERE id = %s", (subscriber_id,))[0]))


def list_unsubscribe_path(headers) -> str:
    """The https target of a List-Unsubscribe header, as a path on our app."""
    url = re.match(r"<([^>]+)>", headers["List-Unsubscribe"]).group(1)
    return urlsplit(url).path


def one_click(path: str, encoding: str):
    """What a mail client sends (RFC 8058): no cookie, no redirect followed."""
    from app.web import app

    with TestClient(app) as mail_client:
        if encoding == "urlencoded":
            r = mail_client.post(
                path,
                content=b"List-Unsubscribe=One-Click",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                follow_redirects=False,
            )
        else:
            r = mail_client.post(path, files={"List-Unsubscribe": (None, "One-Click")}, follow_redirects=False)
    assert r.status_code == 200 and "location" not in r.headers and "set-cookie" not in r.headers
    return r


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


def send_digest(sink, user_id: str) -> dict:
    """Send one digest through the real worker path; the message as received by the SMTP sink."""
    ((sid, cadence),) = db.query("SELECT id, digest_cadence FROM subscribers WHERE user_id = %s", (user_id,))
    factories.events(user_id, 2, entity_id="p1")
    run_id = factories.digest_run(sid, cadence=cadence)
    before = len(sink.messages())
    assert digest_send.process([run_id])["sent"] == 1
    return sink.messages()[before]


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_one_click_from_a_digest_stops_digests_only(sink, fake, provider, encoding):
    sid = factories.subscriber("u1", digest_cadence="weekly")
    message = send_digest(sink, "u1")
    path = list_unsubscribe_path(message)
    assert tokens.verify("unsubscribe", path.removeprefix("/u/")).scope == streams.DIGESTS
    # The body's visible link is the same stream's link.
    assert path in message.get_body(("html",)).get_content()

    pending = factories.digest_run(sid, cadence="weekly", period=date(2030, 1, 7))
    r = one_click(path, encoding)
    assert "no longer get digest emails" in r.text
    row = state(sid)
    assert (row["digest_cadence"], row["digest_cadence_before_off"]) == ("off", "weekly")
    assert row["newsletters_unsubscribed_at"] is None and row["unsubscribed_at"] is None
    assert db.query("SELECT status FROM digest_runs WHERE id = %s", (pending,))[0][0] == "cancelled"

    # Newsletters still arrive.
    nl = factories.newsletter()
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 1}


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_one_click_from_a_newsletter_stops_newsletters_only(sink, fake, provider, encoding):
    sid = factories.subscriber("u1")
    nl = factories.newsletter()
    start(nl)
    drain(nl, provider)
    (mail,) = fake.delivered.values()
    path = list_unsubscribe_path(mail["headers"])
    assert tokens.verify("unsubscribe", path.removeprefix("/u/")).scope == streams.NEWSLETTERS
    assert path in mail["html"]

    r = one_click(path, encoding)
    assert "no longer get newsletters" in r.text
    row = state(sid)
    assert row["newsletters_unsubscribed_at"] is not None
    assert row["digest_cadence"] == "daily" and row["unsubscribed_at"] is None

    # The next newsletter skips them when the outbox is built; digests still go out.
    nl2 = factories.newsletter()
    start(nl2)
    drain(nl2, provider)
    assert counts(nl2) == {"suppressed": 1}
    assert (
        db.query("SELECT error FROM email_log WHERE newsletter_id = %s", (nl2,))[0][0]
        == "unsubscribed from newsletters"
    )
    send_digest(sink, "u1")


def test_newsletter_stream_is_checked_at_claim_time(fake, provider, client):
    """I6: an outbox row built before the unsubscribe is not sent after it."""
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)  # rows are `pending` now
    assert counts(nl) == {"pending": 3}
    client.post("/u/" + tokens.make("unsubscribe", 2, 1, streams.NEWSLETTERS), data={"List-Unsubscribe": "One-Click"})
    drain(nl, provider)
    assert counts(nl) == {"sent": 2, "suppressed": 1}
    assert db.query("SELECT subscriber_id, error FROM email_log WHERE status = 'suppressed'") == [
        (2, "unsubscribed from newsletters before send")
    ]


@pytest.mark.parametrize("scope", [streams.DIGESTS, streams.NEWSLETTERS])
def test_the_page_says_what_the_link_stops_and_offers_everything(client, scope):
    sid = factories.subscriber("u1")
    path = "/u/" + tokens.make("unsubscribe", sid, 1, scope)
    what = {"digests": "digest emails", "newsletters": "newsletters"}[scope]
    page = client.get(path)
    assert f"Stop {what} to <strong>u1@example.test</strong>?" in page.text
    assert 'value="unsubscribe"' in page.text and 'value="unsubscribe_all"' in page.text
    assert state(sid)["unsubscribed_at"] is None  # GET changes nothing

    r = client.post(path, data={"action": "unsubscribe"}, follow_redirects=False)
    assert r.status_code == 303
    page = client.get(r.headers["location"])
    assert f"no longer gets {what}. Other emails still arrive." in page.text
    assert 'value="resubscribe"' in page.text and 'value="unsubscribe_all"' in page.text

    # "everything" from the same page, no CSRF needed to leave
    r = client.post(path, data={"action": "unsubscribe_all"}, follow_redirects=False)
    assert r.status_code == 303 and state(sid)["unsubscribed_at"] is not None
    page = client.get(path)
    assert "no longer gets any emails from us" in page.text and 'value="resubscribe_all"' in page.text
    csrf = CSRF_RE.search(page.text).group(1)
    client.post(path, data={"action": "resubscribe_all", "csrf_token": csrf})
    row = state(sid)
    assert row["unsubscribed_at"] is None
    # the stream itself stays stopped until resubscribed on its own
    assert (row["digest_cadence"] == "off") == (scope == streams.DIGESTS)
    assert (row["newsletters_unsubscribed_at"] is not None) == (scope == streams.NEWSLETTERS)


def test_everything_stops_both_streams(sink, fake, provider, client):
    sid = factories.subscriber("u1")
    client.post("/u/" + tokens.make("unsubscribe", sid, 1, streams.DIGESTS), data={"action": "unsubscribe_all"})
    nl = factories.newsletter()
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"suppressed": 1}
    factories.events("u1", 2)
    run_id = factories.digest_run(sid)
    assert digest_send.process([run_id])["sent"] == 0
    assert db.query("SELECT status, skip_reason FROM digest_runs WHERE id = %s", (run_id,)) == [
        ("skipped", "unsubscribed")
    ]


@pytest.mark.parametrize("cadence", ["weekly", "daily"])
def test_resubscribing_to_digests_restores_the_previous_cadence(client, cadence):
    sid = factories.subscriber("u1", digest_cadence=cadence)
    path = "/u/" + tokens.make("unsubscribe", sid, 1, streams.DIGESTS)
    client.post(path, data={"List-Unsubscribe": "One-Click"})
    client.post(path, data={"List-Unsubscribe": "One-Click"})  # repeated: keeps what it recorded
    assert state(sid)["digest_cadence_before_off"] == cadence
    csrf = CSRF_RE.search(client.get(path).text).group(1)
    assert client.post(path, data={"action": "resubscribe"}).status_code == 403  # CSRF-checked
    client.post(path, data={"action": "resubscribe", "csrf_token": csrf})
    row = state(sid)
    assert (row["digest_cadence"], row["digest_cadence_before_off"]) == (cadence, None)


def test_digests_off_without_a_recorded_cadence_come_back_daily(client):
    sid = factories.subscriber("u1", digest_cadence="off")
    path = "/u/" + tokens.make("unsubscribe", sid, 1, streams.DIGESTS)
    page = client.get(path)
    assert "no longer gets digest emails" in page.text
    client.post(path, data={"action": "resubscribe", "csrf_token": CSRF_RE.search(page.text).group(1)})
    assert state(sid)["digest_cadence"] == "daily"


@pytest.mark.parametrize(
    "scope, expected",
    [
        (None, "everything"),  # every link mailed before streams existed
        ("newsletter:12", "everything"),  # the golden fixture's scope: it always meant everything
        ("category:likes", "category"),
        ("digests", "digests"),
        ("newsletters", "newsletters"),
        ("something-newer", "everything"),  # a later release's scope after a rollback
    ],
)
def test_scope_meanings(scope, expected):
    assert streams.target(scope).kind == expected


def test_old_unscoped_one_click_still_stops_everything(client):
    sid = factories.subscriber("u1")
    r = client.post("/u/" + tokens.make("unsubscribe", sid, 1), data={"List-Unsubscribe": "One-Click"})
    assert "will no longer get emails from us" in r.text
    row = state(sid)
    assert row["unsubscribed_at"] is not None and row["digest_cadence"] == "daily"


def test_a_revoked_stream_token_changes_nothing(client):
    sid = factories.subscriber("u1")
    db.query("UPDATE subscribers SET token_version = 2 WHERE id = %s", (sid,))
    for scope in (streams.DIGESTS, streams.NEWSLETTERS):
        r = client.post("/u/" + tokens.make("unsubscribe", sid, 1, scope), data={"List-Unsubscribe": "One-Click"})
        assert r.status_code == 404
    row = state(sid)
    assert row["digest_cadence"] == "daily" and row["newsletters_unsubscribed_at"] is None


def test_digests_turned_off_on_the_preference_page_come_back_on_their_cadence(client):
    sid = factories.subscriber("u1", digest_cadence="weekly")
    prefs = "/preferences/" + tokens.make("preferences", sid, 1)
    form = {
        "csrf_token": CSRF_RE.search(client.get(prefs).text).group(1),
        "action": "save",
        "digest_cadence": "off",
        "digest_hour": "9",
        "digest_weekday": "0",
        "timezone": "UTC",
    }
    assert client.post(prefs, data=form, follow_redirects=False).status_code == 303
    assert (state(sid)["digest_cadence"], state(sid)["digest_cadence_before_off"]) == ("off", "weekly")
    path = "/u/" + tokens.make("unsubscribe", sid, 1, streams.DIGESTS)
    client.post(path, data={"action": "resubscribe", "csrf_token": CSRF_RE.search(client.get(path).text).group(1)})
    assert (state(sid)["digest_cadence"], state(sid)["digest_cadence_before_off"]) == ("weekly", None)
