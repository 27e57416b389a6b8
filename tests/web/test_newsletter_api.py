"""Admin API for newsletters: validation, auth, state transitions, status with counts and engagement."""

from __future__ import annotations

import pytest

from app.newsletter import service
from app.platform import db
from app.web.api import newsletters
from tests import factories
from tests.conftest import auth
from tracking import webhook_apply


@pytest.fixture(autouse=True)
def _redis(redis_client):  # the API enqueues on the test Redis; start and end with it empty
    yield


def create(client, key, **body):
    payload = {"subject": "Hello {{name}}", "html": factories.HTML, **body}
    return client.post("/v1/newsletters", json=payload, headers=auth(key))


def test_create_returns_201_and_id(client, admin_key):
    r = create(
        client, admin_key, text="Hi {{name}}, unsubscribe: {{unsubscribe_url}}", **{"from": "News <news@example.com>"}
    )
    assert r.status_code == 201
    newsletter_id = r.json()["id"]
    assert db.query("SELECT status, from_addr, text FROM newsletters WHERE id = %s", (newsletter_id,))[0] == (
        "draft",
        "News <news@example.com>",
        "Hi {{name}}, unsubscribe: {{unsubscribe_url}}",
    )


def test_requires_admin_key(client, events_key):
    assert client.post("/v1/newsletters", json={"subject": "x", "html": "y"}).status_code == 401
    r = create(client, events_key)
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert client.get("/v1/newsletters/1", headers=auth(events_key)).status_code == 403
    assert client.post("/v1/newsletters/1/pause", headers=auth(events_key)).status_code == 403


@pytest.mark.parametrize(
    "body, field",
    [
        ({"html": "<p>x</p>"}, "subject"),
        ({"subject": "x"}, "html"),
        ({"subject": "x", "html": "<p>{{#name}}</p>"}, "html"),
        ({"subject": "x", "html": "<p>{{first_name}}</p>"}, "html"),
        ({"subject": "x", "html": "<p>{{> header}}</p>"}, "html"),
        ({"subject": "a\nBcc: victim@example.com", "html": "<p>x</p>"}, "subject"),
        ({"subject": "x" * 501, "html": "<p>x</p>"}, "subject"),
        ({"subject": "x", "html": "<p>x</p>", "text": ""}, "text"),
        ({"subject": "x", "html": "<p>x</p>", "from": "not an address"}, "from"),
        ({"subject": "x", "html": "<p>x</p>", "reply_to": "a@b.c"}, "reply_to"),
        ({"subject": 5, "html": "<p>x</p>"}, "subject"),
    ],
)
def test_create_validation_errors(client, admin_key, body, field):
    r = client.post("/v1/newsletters", json=body, headers=auth(admin_key))
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]]
    assert db.query("SELECT count(*) FROM newsletters")[0][0] == 0


def test_create_body_limits(client, admin_key):
    r = client.post("/v1/newsletters", json={"subject": "x", "html": "x" * (512 * 1024 + 1)}, headers=auth(admin_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "html"
    r = client.post(
        "/v1/newsletters",
        content=b'{"subject": "' + b"x" * newsletters.CREATE_BODY_LIMIT + b'"}',
        headers={**auth(admin_key), "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    r = client.post("/v1/newsletters", content=b"{not json", headers=auth(admin_key))
    assert r.status_code == 400


def test_send_flow_and_transitions(client, admin_key):
    factories.seed_subscribers(3)
    nl = create(client, admin_key).json()["id"]
    h = auth(admin_key)
    assert client.post(f"/v1/newsletters/{nl}/pause", headers=h).status_code == 409  # draft
    assert client.post(f"/v1/newsletters/{nl}/retry-failed", headers=h).status_code == 409
    r = client.post(f"/v1/newsletters/{nl}/send", json={"audience": "all"}, headers=h)
    assert r.status_code == 202 and r.json() == {
        "id": nl,
        "status": "queued",
        "unknown_user_ids": [],
        "unknown_user_ids_count": 0,
    }
    # Same request again (client retry): accepted, nothing changes.
    assert client.post(f"/v1/newsletters/{nl}/send", json={"audience": "all"}, headers=h).status_code == 202
    r = client.post(f"/v1/newsletters/{nl}/send", json={"audience": {"user_ids": ["u1"]}}, headers=h)
    assert r.status_code == 409
    assert client.post(f"/v1/newsletters/{nl}/pause", headers=h).json()["status"] == "paused"
    assert client.post(f"/v1/newsletters/{nl}/pause", headers=h).status_code == 200  # idempotent
    assert client.post(f"/v1/newsletters/{nl}/resume", headers=h).json()["status"] == "sending"
    r = client.post(f"/v1/newsletters/{nl}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.post(f"/v1/newsletters/{nl}/cancel", headers=h).status_code == 200  # idempotent
    assert client.post(f"/v1/newsletters/{nl}/resume", headers=h).status_code == 409
    assert client.post(f"/v1/newsletters/{nl}/send", json={"audience": "all"}, headers=h).status_code == 409
    assert db.query("SELECT audience FROM newsletters")[0][0] == {"kind": "all"}


def test_send_answer_names_the_user_ids_that_are_no_subscriber(client, admin_key):
    factories.seed_subscribers(3)
    nl = create(client, admin_key).json()["id"]
    audience = {"user_ids": ["u2", "nobody", "u1", "ghost", "u2", "ünï\u200bcode"]}
    r = client.post(f"/v1/newsletters/{nl}/send", json={"audience": audience}, headers=auth(admin_key))
    assert r.status_code == 202, r.text
    assert r.json()["unknown_user_ids"] == ["ghost", "nobody", "ünï\u200bcode"]
    assert r.json()["unknown_user_ids_count"] == 3
    many = {"user_ids": [f"x{i:05d}" for i in range(service.UNKNOWN_SHOWN + 5)]}
    nl2 = create(client, admin_key).json()["id"]
    r = client.post(f"/v1/newsletters/{nl2}/send", json={"audience": many}, headers=auth(admin_key))
    assert len(r.json()["unknown_user_ids"]) == service.UNKNOWN_SHOWN and r.json()["unknown_user_ids_count"] == 1005


def test_list_newsletters_newest_first_in_keyset_pages_with_counts(client, admin_key, fake, provider):
    from tests.newsletter_support import drain, start

    factories.seed_subscribers(4)
    h = auth(admin_key)
    ids = [create(client, admin_key).json()["id"] for _ in range(5)]
    start(ids[0])
    drain(ids[0], provider)  # done: counts stored when it finished
    start(ids[1])  # sending: counted now
    r = client.get("/v1/newsletters?limit=2", headers=h)
    assert r.status_code == 200, r.text
    page = r.json()
    assert [n["id"] for n in page["newsletters"]] == [ids[4], ids[3]] and page["next_before"] == ids[3]
    assert page["newsletters"][0]["status"] == "draft" and page["newsletters"][0]["counts"]["total"] == 0
    rest = client.get(f"/v1/newsletters?limit=2&before={page['next_before']}", headers=h).json()
    assert [n["id"] for n in rest["newsletters"]] == [ids[2], ids[1]]
    last = client.get(f"/v1/newsletters?limit=2&before={rest['next_before']}", headers=h).json()
    assert [n["id"] for n in last["newsletters"]] == [ids[0]] and last["next_before"] is None
    done = last["newsletters"][0]
    assert done["status"] == "done" and done["counts"] == {
        "pending": 0,
        "sending": 0,
        "sent": 4,
        "failed": 0,
        "suppressed": 0,
        "cancelled": 0,
        "total": 4,
    }
    assert db.query("SELECT final_counts FROM newsletters WHERE id = %s", (ids[0],))[0][0] == {"sent": 4}
    assert rest["newsletters"][1]["counts"]["pending"] == 4 and rest["newsletters"][1]["counts"]["total"] == 4
    only_done = client.get("/v1/newsletters?status=done", headers=h).json()["newsletters"]
    assert [n["id"] for n in only_done] == [ids[0]]


@pytest.mark.parametrize(
    "query, field",
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=abc", "limit"),
        ("before=-1", "before"),
        ("before=99999999999999999999", "before"),
        ("status=sent", "status"),
        ("colour=red", "colour"),
        ("limit=%F0%9F%98%80", "limit"),
        ("status=%00", "status"),
    ],
)
def test_list_query_problems_name_the_parameter(client, admin_key, query, field):
    r = client.get(f"/v1/newsletters?{query}", headers=auth(admin_key))
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == field


def test_list_needs_an_admin_key(client):
    assert client.get("/v1/newsletters").status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"audience": "everyone"},
        {"audience": {"user_ids": []}},
        {"audience": {"user_ids": [5]}},
        {"audience": {"user_ids": ["u"] * 10_001}},
        {"audience": "all", "extra": 1},
        [1, 2],
    ],
)
def test_send_validation(client, admin_key, body):
    nl = create(client, admin_key).json()["id"]
    r = client.post(f"/v1/newsletters/{nl}/send", json=body, headers=auth(admin_key))
    assert r.status_code == 422, r.text
    assert db.query("SELECT status FROM newsletters")[0][0] == "draft"


def test_unknown_newsletter_is_404(client, admin_key):
    h = auth(admin_key)
    assert client.get("/v1/newsletters/999", headers=h).status_code == 404
    assert client.post("/v1/newsletters/999/send", json={"audience": "all"}, headers=h).status_code == 404
    for action in ("pause", "resume", "cancel", "retry-failed"):
        assert client.post(f"/v1/newsletters/999/{action}", headers=h).status_code == 404
    assert client.get("/v1/newsletters/99999999999999999999", headers=h).status_code == 404


def test_status_counts_and_engagement(client, admin_key):
    factories.seed_subscribers(6)
    nl = create(client, admin_key).json()["id"]
    other = create(client, admin_key).json()["id"]
    db.query("UPDATE newsletters SET status = 'sending', outbox_completed_at = now() WHERE id = %s", (nl,))
    for sub, status in [(1, "sent"), (2, "sent"), (3, "failed"), (4, "suppressed"), (5, "pending"), (6, "sending")]:
        factories.outbox_row(nl, sub, "x", status)
    factories.outbox_row(other, 1, "x", "sent")
    for kind, sub, machine in [("open", 1, False), ("open", 1, False), ("open", 2, True), ("click", 2, False)]:
        db.query(
            "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id, is_machine) "
            "VALUES (%s, 'newsletter', %s, %s, %s)",
            (kind, nl, sub, machine),
        )
    db.query(
        "INSERT INTO email_link_history (kind, mail_kind, mail_id, subscriber_id) VALUES ('open', 'digest', %s, 1)",
        (nl,),
    )
    for i, (event, mail_id) in enumerate(
        [("bounce", nl), ("unsubscribe", nl), ("spamreport", nl), ("delivered", nl), ("bounce", other)]
    ):
        db.query(
            "INSERT INTO webhook_events (sg_event_id, event, email, payload) VALUES (%s, %s, %s, %s)",
            (
                f"e{i}",
                event,
                f"r{i}@example.com",
                f'{{"event": "{event}", "email": "r{i}@example.com", "mail_kind": "newsletter", '
                f'"mail_id": "{mail_id}"}}',
            ),
        )
    webhook_apply.apply_events([row[0] for row in db.query("SELECT id FROM webhook_events")])
    r = client.get(f"/v1/newsletters/{nl}", headers=auth(admin_key))
    assert r.status_code == 200
    s = r.json()
    assert s["status"] == "sending"
    assert s["counts"] == {
        "total": 6,
        "pending": 1,
        "sending": 1,
        "sent": 2,
        "failed": 1,
        "suppressed": 1,
        "cancelled": 0,
    }
    assert s["opens"] == {"total": 3, "human": 2, "machine": 1, "unique_human": 1}
    assert s["clicks"] == {"total": 1, "human": 1, "machine": 0, "unique_human": 1}
    assert s["bounces"] == 1 and s["unsubscribes"] == 2


def test_openapi_documents_newsletter_paths(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/newsletters",
        "/v1/newsletters/{newsletter_id}",
        "/v1/newsletters/{newsletter_id}/send",
        "/v1/newsletters/{newsletter_id}/pause",
        "/v1/newsletters/{newsletter_id}/retry-failed",
    ):
        assert path in paths


def test_cli_status_once(capsys):
    from app import cli

    factories.seed_subscribers(2)
    nl = factories.newsletter()
    factories.outbox_row(nl, 1, "x", "sent")
    factories.outbox_row(nl, 2, "y", "pending")
    db.query("UPDATE newsletters SET status = 'sending' WHERE id = %s", (nl,))
    assert cli.main(["newsletter-status", str(nl), "--once"]) == 0
    out = capsys.readouterr().out
    assert "50.0%" in out and "sent 1" in out and "pending 1" in out and "of 2" in out
    assert cli.main(["newsletter-status", "424242", "--once"]) == 1
