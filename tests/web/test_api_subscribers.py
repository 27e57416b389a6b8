"""Subscribers API (admin scope): create/replace, read, erase; validation names the field."""

from __future__ import annotations

import pytest

from app.platform import db
from tests import factories
from tests.conftest import auth


def put(client, key, user_id="u1", **body):
    body.setdefault("email", "ana@example.com")
    return client.put(f"/v1/subscribers/{user_id}", json=body, headers=auth(key))


def test_create_read_replace(client, admin_key):
    r = put(
        client,
        admin_key,
        name="Ana",
        timezone="America/Sao_Paulo",
        digest_cadence="weekly",
        digest_hour=7,
        digest_weekday="friday",
        category_opt_outs=["follows", "likes", "likes"],
    )
    assert r.status_code == 201
    got = client.get("/v1/subscribers/u1", headers=auth(admin_key)).json()
    assert got["timezone"] == "America/Sao_Paulo" and got["digest_cadence"] == "weekly"
    assert got["digest_hour"] == 7 and got["digest_weekday"] == 4 and got["digest_weekday_name"] == "friday"
    assert got["category_opt_outs"] == ["follows", "likes"]
    r = put(client, admin_key, email="new@example.com")
    assert r.status_code == 200
    got = r.json()
    assert got["email"] == "new@example.com" and got["digest_cadence"] == "daily"  # PUT replaces


@pytest.mark.parametrize(
    "field,value",
    [
        ("timezone", "Mars/Olympus_Mons"),
        ("timezone", "../../etc/passwd"),
        ("email", "not-an-email"),
        ("digest_cadence", "fortnightly"),
        ("digest_hour", 24),
        ("digest_hour", True),
        ("digest_weekday", 7),
        ("category_opt_outs", "likes"),
        ("nickname", "x"),
    ],
)
def test_invalid_fields_are_422_and_nothing_saved(client, admin_key, field, value):
    r = put(client, admin_key, **{field: value})
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert db.query("SELECT count(*) FROM subscribers") == [(0,)]


def test_email_is_required(client, admin_key):
    r = client.put("/v1/subscribers/u1", json={"name": "x"}, headers=auth(admin_key))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "email"


def test_events_scope_cannot_manage_subscribers(client, events_key):
    r = put(client, events_key)
    assert r.status_code == 403


def test_missing_subscriber_is_404(client, admin_key):
    assert client.get("/v1/subscribers/ghost", headers=auth(admin_key)).status_code == 404
    assert client.delete("/v1/subscribers/ghost", headers=auth(admin_key)).status_code == 404


def test_delete_erases_subscriber_and_their_events(client, admin_key):
    put(client, admin_key)
    put(client, admin_key, user_id="u2", email="bo@example.com")
    for uid in ("u1", "u1", "u2"):
        client.post(
            "/v1/events",
            json={
                "id": f"{uid}-{db.query('SELECT count(*) FROM digest_events')[0][0]}",
                "user_id": uid,
                "category": "c",
                "entity_type": "t",
                "entity_id": "e",
            },
            headers=auth(admin_key),
        )
    sub_id = db.query("SELECT id FROM subscribers WHERE user_id = 'u1'")[0][0]
    factories.digest_run(sub_id)
    r = client.delete("/v1/subscribers/u1", headers=auth(admin_key))
    assert r.status_code == 204
    assert db.query("SELECT user_id FROM subscribers") == [("u2",)]
    assert db.query("SELECT user_id FROM digest_events") == [("u2",)]
    assert db.query("SELECT count(*) FROM digest_runs") == [(0,)]


def test_cadence_change_cancels_pending_run_of_old_cadence(client, admin_key):
    put(client, admin_key)
    sub_id = db.query("SELECT id FROM subscribers")[0][0]
    factories.digest_run(sub_id, period="2026-11-20", status="processing")
    factories.digest_run(sub_id, period="2026-11-21")
    put(client, admin_key, digest_cadence="weekly")
    assert db.query("SELECT period::text, status FROM digest_runs ORDER BY period") == [
        ("2026-11-20", "processing"),
        ("2026-11-21", "cancelled"),
    ]


@pytest.mark.parametrize("email", ["ana@example.com\n", "ana@example.com\r\nBcc: x@y.z"])
def test_email_with_trailing_newline_is_rejected(client, admin_key, email):
    assert put(client, admin_key, email=email).status_code == 422


def test_apostrophe_addresses_are_accepted_and_mailable(client, admin_key):
    from app.platform.mail import build
    from app.platform.providers.base import OutgoingMail

    assert put(client, admin_key, email="o'brien@example.com").status_code == 201
    raw = build(OutgoingMail(to="o'brien@example.com", subject="s", html="<p>h</p>", text="t", idempotency_key="k-1"))
    assert b"\r\nTo: o'brien@example.com\r\n" in raw
