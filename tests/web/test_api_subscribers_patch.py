"""PATCH /v1/subscribers/{user_id}: a JSON merge patch (RFC 7396) changes only the fields it names."""

from __future__ import annotations

import threading

import psycopg2
import pytest

from app.platform import config, db
from tests import factories
from tests.conftest import auth, wait_for
from tests.web.test_pages import csrf_from, pref_path, save_form

MERGE_PATCH = "application/merge-patch+json"

START = {
    "email": "ana@example.com",
    "name": "Ana",
    "timezone": "Asia/Tokyo",
    "digest_cadence": "weekly",
    "digest_hour": 7,
    "digest_weekday": 4,
    "category_opt_outs": ["likes"],
    "tracking_opt_out": True,
    "locale": "de",
    "quiet_hours": {"start": "22:00", "end": "07:00"},
    "max_mails_per_day": 4,
}


def patch(client, key, body, user_id="u1", content_type=MERGE_PATCH):
    import orjson

    return client.patch(
        f"/v1/subscribers/{user_id}",
        content=orjson.dumps(body),
        headers={**auth(key), "Content-Type": content_type},
    )


@pytest.fixture
def ana(client, admin_key):
    r = client.put("/v1/subscribers/u1", json=START, headers=auth(admin_key))
    assert r.status_code == 201
    return r.json()


def _fields(record: dict) -> dict:
    return {k: record[k] for k in START}


@pytest.mark.parametrize(
    "field,value,stored",
    [
        ("email", "new@example.com", "new@example.com"),
        ("name", "  Ana Lima ", "Ana Lima"),
        ("timezone", "Europe/Lisbon", "Europe/Lisbon"),
        ("digest_cadence", "daily", "daily"),
        ("digest_hour", 21, 21),
        ("digest_weekday", "sunday", 6),
        ("category_opt_outs", ["b", "a", "a"], ["a", "b"]),
        ("tracking_opt_out", False, False),
        ("locale", "pt_br", "pt-BR"),
        ("locale", None, None),
        ("quiet_hours", {"start": "23:30", "end": "06:00"}, {"start": "23:30", "end": "06:00"}),
        ("quiet_hours", None, None),
        ("max_mails_per_day", 0, 0),
        ("max_mails_per_day", 3, 3),
    ],
)
def test_each_field_alone_changes_only_itself(client, admin_key, ana, field, value, stored):
    r = patch(client, admin_key, {field: value})
    assert r.status_code == 200, r.text
    assert _fields(r.json()) == {**START, field: stored}
    got = client.get("/v1/subscribers/u1", headers=auth(admin_key)).json()
    assert _fields(got) == {**START, field: stored}


def test_email_patch_updates_the_canonical_address(client, admin_key, ana):
    patch(client, admin_key, {"email": "New.Person@EXAMPLE.com"})
    assert db.query("SELECT canonical_email FROM subscribers") == [("new.person@example.com",)]


def test_null_clears_optional_fields_to_puts_defaults(client, admin_key, ana):
    body = dict.fromkeys(("name", "timezone", "digest_cadence", "digest_hour", "digest_weekday"), None)
    body.update(category_opt_outs=None, tracking_opt_out=None, locale=None, quiet_hours=None, max_mails_per_day=None)
    r = patch(client, admin_key, body)
    assert r.status_code == 200, r.text
    assert _fields(r.json()) == {
        "email": "ana@example.com",
        "name": "",
        "timezone": "UTC",
        "digest_cadence": "daily",
        "digest_hour": 9,
        "digest_weekday": 0,
        "category_opt_outs": [],
        "tracking_opt_out": False,
        "locale": None,
        "quiet_hours": None,
        "max_mails_per_day": None,
    }


def test_null_for_the_required_email_is_422_naming_it(client, admin_key, ana):
    r = patch(client, admin_key, {"email": None, "name": "Bo"})
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["email"]
    assert client.get("/v1/subscribers/u1", headers=auth(admin_key)).json()["name"] == "Ana"


@pytest.mark.parametrize(
    "body,field",
    [
        ({"nickname": "x"}, "nickname"),
        ({"digest_hour": 24}, "digest_hour"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"email": "not-an-email"}, "email"),
        ({"locale": "xx-klingon"}, "locale"),
        ({"locale": 42}, "locale"),
        ({"quiet_hours": {"start": "22:00", "end": "22:00"}}, "quiet_hours"),
        ({"quiet_hours": {"start": "7:00", "end": "22:00"}}, "quiet_hours"),
        ({"quiet_hours": "22:00-07:00"}, "quiet_hours"),
        ({"max_mails_per_day": -1}, "max_mails_per_day"),
        ({"max_mails_per_day": 1001}, "max_mails_per_day"),
        ({"max_mails_per_day": "3"}, "max_mails_per_day"),
        ({"user_id": "someone-else"}, "user_id"),
        (["name"], "body"),
    ],
)
def test_bad_patches_are_422_and_change_nothing(client, admin_key, ana, body, field):
    before = db.query("SELECT * FROM subscribers")
    r = patch(client, admin_key, body)
    assert r.status_code == 422
    assert field in [e["field"] for e in r.json()["errors"]]
    assert db.query("SELECT * FROM subscribers") == before


def test_the_user_id_may_be_echoed(client, admin_key, ana):
    assert patch(client, admin_key, {"user_id": "u1", "name": "Bo"}).json()["name"] == "Bo"


def test_unknown_subscriber_is_404(client, admin_key):
    r = patch(client, admin_key, {"name": "Bo"}, user_id="ghost")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert db.query("SELECT count(*) FROM subscribers") == [(0,)]


def test_an_empty_patch_changes_nothing_and_answers_the_subscriber(client, admin_key, ana):
    r = patch(client, admin_key, {})
    assert r.status_code == 200 and _fields(r.json()) == START


@pytest.mark.parametrize("content_type", [MERGE_PATCH, "application/json", "application/json; charset=utf-8"])
def test_both_json_media_types_are_accepted(client, admin_key, ana, content_type):
    assert patch(client, admin_key, {"name": "Bo"}, content_type=content_type).status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_other_media_types_are_415_in_the_api_error_shape(client, admin_key, ana, content_type):
    r = patch(client, admin_key, {"name": "Bo"}, content_type=content_type)
    assert r.status_code == 415
    assert r.json()["error"] == "unsupported_media_type"
    assert MERGE_PATCH in r.headers["accept-patch"]
    assert client.get("/v1/subscribers/u1", headers=auth(admin_key)).json()["name"] == "Ana"


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_a_body_over_64_kib_is_413_as_documented(client, admin_key, ana, method):
    body = b'{"name": "' + b"a" * (64 * 1024) + b'"}'
    headers = {**auth(admin_key), "Content-Type": MERGE_PATCH if method == "PATCH" else "application/json"}
    r = client.request(method, "/v1/subscribers/u1", content=body, headers=headers)
    assert (r.status_code, r.json()["error"]) == (413, "body_too_large")
    operation = client.get("/openapi.json").json()["paths"]["/v1/subscribers/{user_id}"][method.lower()]
    assert "413" in operation["responses"]


def test_events_scope_cannot_patch(client, events_key, ana):
    assert patch(client, events_key, {"name": "Bo"}).status_code == 403


@pytest.mark.parametrize(
    "body", [{"digest_cadence": "daily"}, {"digest_hour": 20}, {"timezone": "Europe/Lisbon"}, {"digest_weekday": 1}]
)
def test_a_schedule_change_cancels_runs_planned_for_the_old_schedule(client, admin_key, ana, body):
    run_id = factories.digest_run(ana["id"], cadence="weekly")
    db.query("UPDATE subscribers SET digest_planned_until = now() WHERE id = %s", (ana["id"],))
    assert patch(client, admin_key, body).status_code == 200
    assert db.query("SELECT status, skip_reason FROM digest_runs WHERE id = %s", (run_id,)) == [
        ("cancelled", "schedule changed")
    ]
    assert db.query("SELECT digest_planned_until FROM subscribers") == [(None,)]


def test_a_patch_leaving_the_schedule_as_it_was_cancels_nothing(client, admin_key, ana):
    run_id = factories.digest_run(ana["id"], cadence="weekly")
    assert patch(client, admin_key, {"digest_hour": 7, "name": "Bo"}).status_code == 200
    assert db.query("SELECT status FROM digest_runs WHERE id = %s", (run_id,)) == [("pending",)]


def test_choices_made_on_the_preference_page_survive_a_patch_of_the_email(client, admin_key):
    sid = factories.subscriber("u1", email="ana@example.com")
    page = client.get(pref_path(sid))
    form = save_form(csrf_from(page), digest_cadence="weekly", digest_hour="18", digest_weekday="4")
    form.update(timezone="America/New_York", shown_category=["likes"], category=[])
    assert client.post(pref_path(sid), data=form, follow_redirects=False).status_code == 303
    r = patch(client, admin_key, {"email": "ana.lima@example.com"})
    assert r.status_code == 200
    got = r.json()
    assert got["email"] == "ana.lima@example.com" and got["name"] == "Ana Lima"
    assert (got["digest_cadence"], got["digest_hour"], got["digest_weekday"], got["timezone"]) == (
        "weekly",
        18,
        4,
        "America/New_York",
    )
    assert got["category_opt_outs"] == ["likes"]


def test_two_patches_of_different_fields_at_once_both_land(client, admin_key, ana):
    """One patch waits on the row lock another holds: with a read-modify-write the later one would
    write back the name it read before the first committed."""
    holder = psycopg2.connect(config.get().database_url)
    try:
        with holder.cursor() as cur:
            cur.execute("UPDATE subscribers SET name = 'Held' WHERE user_id = 'u1'")  # lock, not committed
            answers = []
            other = threading.Thread(target=lambda: answers.append(patch(client, admin_key, {"digest_hour": 5})))
            other.start()
            wait_for(
                lambda: db.query(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND query LIKE 'UPDATE subscribers%%'"
                )[0][0],
                what="the patch to wait for the row lock",
            )
        holder.commit()
        other.join()
    finally:
        holder.close()
    assert answers[0].status_code == 200
    got = client.get("/v1/subscribers/u1", headers=auth(admin_key)).json()
    assert (got["name"], got["digest_hour"]) == ("Held", 5)


def test_patch_is_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/subscribers/{user_id}"]["patch"]
    assert set(op["requestBody"]["content"]) == {MERGE_PATCH, "application/json"}
    assert {"404", "415", "422"} <= set(op["responses"])
    schema = doc["components"]["schemas"]["SubscriberPatch"]
    assert "required" not in schema and set(schema["properties"]) == set(START)


def test_held_until_is_when_the_quiet_window_holding_now_ends(client, admin_key, ana):
    """A window around the clock's current UTC hour holds mail until it ends; one away from it holds
    nothing (the subscriber is in Asia/Tokyo: wall-clock times are theirs)."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    now = datetime.now(ZoneInfo("Asia/Tokyo"))
    start, end = (now - timedelta(hours=1)).strftime("%H:%M"), (now + timedelta(hours=2)).strftime("%H:%M")
    held = patch(client, admin_key, {"quiet_hours": {"start": start, "end": end}}).json()["held_until"]
    assert held is not None and timedelta(hours=1) < datetime.fromisoformat(held) - datetime.now(UTC) <= timedelta(
        hours=2
    )
    away = ((now + timedelta(hours=3)).strftime("%H:%M"), (now + timedelta(hours=4)).strftime("%H:%M"))
    assert patch(client, admin_key, {"quiet_hours": dict(zip(("start", "end"), away))}).json()["held_until"] is None
