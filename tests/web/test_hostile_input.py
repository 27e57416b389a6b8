"""Issue 25, items 5 and 6: every 500 a stranger or an admin could reach becomes a 4xx naming what
was wrong, and nothing is accepted that cannot be sent (Unicode line breaks in names and senders).
In process (TestClient) over the real Postgres and Redis; the webhook's header over a real uvicorn
and a raw socket, because an HTTP client library re-encodes such a header."""

from __future__ import annotations

import base64
import re
import sys
import time
from zoneinfo import ZoneInfo

import pytest
from starlette.testclient import TestClient

from app.platform import db, tokens
from app.web import app
from tests import factories
from tests.conftest import auth
from tests.raw_http import exchange
from tracking import signature

pytestmark = pytest.mark.varies_input("hostile names, senders and headers over the request path's pooled units")

# Every character str.splitlines() breaks a line at: what the email package's header folding does.
LINE_BREAKS = [c for c in map(chr, range(sys.maxunicode + 1)) if len(f"a{c}b".splitlines()) > 1]
# Zone database entries that are no zone: directories, data files, leap-second and POSIX variants,
# the host's own setting.
NOT_ZONES = [
    "Europe",
    "Etc",
    "US",
    "America/Argentina",
    "right/UTC",
    "posix/Europe/Lisbon",
    "localtime",
    "posixrules",
    "zone.tab",
    "tzdata.zi",
    "leapseconds",
    "iso3166.tab",
    "Europe/",
    "/Europe/Lisbon",
    "Europe/../Europe/Lisbon",
    "Europe//Lisbon",
    ".",
    "",
]


@pytest.fixture
def api(admin_key):
    with TestClient(app, raise_server_exceptions=False) as c:
        c.headers.update(auth(admin_key))
        yield c


def problems(response) -> dict:
    assert response.status_code == 422, (response.status_code, response.text[:300])
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def test_the_line_breaks_checked_here_are_all_of_them():
    assert set(LINE_BREAKS) == set("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


# ---------------------------------------------------------------- path parameters


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("user_id", ["a%00b", "%00", "a" * 201])
def test_a_subscriber_path_postgres_cannot_hold_is_a_422_naming_user_id(api, method, user_id):
    r = api.request(method, f"/v1/subscribers/{user_id}", json={"email": "a@example.com"})
    assert list(problems(r)) == ["user_id"]


def test_the_openapi_document_declares_the_user_id_rule(api):
    (param,) = api.get("/openapi.json").json()["paths"]["/v1/subscribers/{user_id}"]["get"]["parameters"]
    assert param["schema"] == {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^\\u0000]*$"}


# ---------------------------------------------------------------- time zones


@pytest.mark.parametrize("name", NOT_ZONES)
def test_a_time_zone_that_does_not_load_is_a_422_on_the_api(api, name):
    r = api.put("/v1/subscribers/u1", json={"email": "a@example.com", "timezone": name})
    assert list(problems(r)) == ["timezone"]
    assert db.query("SELECT count(*) FROM subscribers") == [(0,)]


def test_every_zone_offered_loads_and_every_loadable_zone_is_accepted(api):
    from app.platform import timezones

    offered = api.get("/openapi.json").json()["components"]["schemas"]["SubscriberInput"]["properties"]["timezone"]
    assert set(offered["enum"]) == timezones.names() and "Europe/Lisbon" in offered["enum"]
    for name in timezones.names():
        ZoneInfo(name)  # raises if not
    assert api.put("/v1/subscribers/u1", json={"email": "a@example.com", "timezone": "US/Eastern"}).status_code == 201


def test_the_preference_page_offers_only_zones_that_load(client):
    from app.platform import timezones

    sid = factories.subscriber("tz")
    page = client.get("/preferences/" + tokens.make("preferences", sid, 1)).text
    datalist = page.split('<datalist id="timezone-list">', 1)[1].split("</datalist>", 1)[0]
    offered = re.findall(r'<option value="([^"]*)">', datalist)
    assert "UTC" in offered and "Europe/Lisbon" in offered and len(offered) > 300
    assert set(offered) <= timezones.names()


def test_a_stored_zone_this_python_cannot_load_is_read_as_utc():
    from app.platform import timezones

    assert timezones.load("Europe") == ZoneInfo("UTC") and timezones.load("Mars/Olympus") == ZoneInfo("UTC")
    assert timezones.load("Asia/Tokyo") == ZoneInfo("Asia/Tokyo") and timezones.load(None) == ZoneInfo("UTC")


# ---------------------------------------------------------------- the preference form


@pytest.fixture
def form(client):
    """(post, csrf): a preference page's form, past its CSRF check."""
    sid = factories.subscriber("form")
    path = "/preferences/" + tokens.make("preferences", sid, 1)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text).group(1)

    def post(**fields):
        return client.post(path, data={"csrf_token": csrf, "action": "save", **fields}, follow_redirects=False)

    return post


@pytest.mark.parametrize(
    "field,value",
    [
        *[("timezone", name) for name in NOT_ZONES if name],
        *[
            (field, value)
            for field in ("digest_hour", "digest_weekday", "pause_days")
            for value in ("--5", "-", "5-", "+5", "-+5", "5-5", "\u00b2", "\u0663", "0x5", "1_0", "1 0")
        ],
    ],
)
def test_hostile_preference_values_answer_the_page_with_the_field_error(client, form, field, value):
    r = form(**{field: value})
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert f'id="{field}-error"' in r.text and 'aria-invalid="true"' in r.text  # the page itself, not a bare error
    assert "Your preferences are saved" not in r.text


def test_plain_numbers_are_read_one_way():
    from app.platform.validation import plain_int
    from app.web.pages import preferences

    assert [plain_int(t, 6, signed=True) for t in ("7", "-3", "007", "-0")] == [7, -3, 7, 0]
    for text in ("--5", "-", "", "5-", "+5", "\u00b2", "\u0663", "\uff13", "1_0", " 5", "5\n", "1234567", None, 5):
        assert plain_int(text, 6, signed=True) is None, text
    assert plain_int("-5", 6) is None and preferences._form_number("--5") == "--5"


# ---------------------------------------------------------------- unsendable names and senders


@pytest.mark.parametrize("char", LINE_BREAKS + ["\x00", "\x01", "\x7f", "\x80", "\x9f"])
def test_a_name_with_a_line_break_or_control_character_is_a_422_naming_it(api, char):
    r = api.put("/v1/subscribers/u1", json={"email": "a@example.com", "name": f"Ana{char}Lima"})
    assert problems(r) == {"name": "must not contain line breaks or control characters"}


@pytest.mark.parametrize("char", LINE_BREAKS + ["\x00", "\x01", "\x7f", "\x80", "\x9f"])
def test_a_sender_with_a_line_break_or_control_character_is_a_422_naming_from(api, char):
    r = api.post(
        "/v1/newsletters", json={"subject": "Hi", "html": "<p>x</p>", "from": f"News{char}Desk <n@example.com>"}
    )
    assert list(problems(r)) == ["from"]


@pytest.mark.parametrize(
    "email",
    [
        "a\u2028b@example.com",
        "a\u2029b@example.com",
        "a\x85b@example.com",
        "ab@exa\u2028mple.com",
        "ab@example.co\u2029m",
    ],
)
def test_an_address_with_a_line_break_is_a_422_naming_email(api, email):
    assert list(problems(api.put("/v1/subscribers/u1", json={"email": email}))) == ["email"]


@pytest.mark.parametrize("char", LINE_BREAKS + ["\x01", "\x08", "\t", "\x7f", "\x85", "\x9f"])
def test_a_subject_with_a_line_break_or_control_character_is_a_422_naming_it(api, char):
    r = api.post("/v1/newsletters", json={"subject": f"Hi{char}there", "html": "<p>x</p>"})
    assert problems(r) == {"subject": "must be a single line without control characters"}


def test_names_senders_and_subjects_without_them_are_still_accepted(api):
    r = api.put("/v1/subscribers/u1", json={"email": "a@example.com", "name": "Zoë O'Brien-Łukasz 李"})
    assert r.status_code == 201
    r = api.post(
        "/v1/newsletters", json={"subject": "Olá {{name}} ✓", "html": "<p>x</p>", "from": "Zoë’s Desk <n@example.com>"}
    )
    assert r.status_code == 201


# ---------------------------------------------------------------- the webhook's headers, raw


@pytest.fixture
def signed_webhook(settings):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    settings(sendgrid_webhook_public_key=base64.b64encode(public).decode())


@pytest.mark.parametrize(
    "timestamp",
    [b"\xb2", b"\xb3\xb9", b"\xb9" * 10, b"1\xb2", b"--5", b"-1", b"+1", b"1 2", b"\xd9\xa3", b"1e9", b"9" * 30],
)
def test_hostile_webhook_timestamps_are_a_403_before_anything_else(live_server, signed_webhook, timestamp):
    answer = exchange(
        live_server,
        b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"X-Twilio-Email-Event-Webhook-Signature: MEUCIQ==\r\n"
        b"X-Twilio-Email-Event-Webhook-Timestamp: " + timestamp + b"\r\nConnection: close\r\n\r\n[]",
    )
    assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
    assert b"timestamp header is not a unix time" in answer


def test_a_well_formed_but_wrong_signature_header_is_still_a_403(signed_webhook):
    with TestClient(app) as c:
        r = c.post(
            "/webhooks/sendgrid",
            content=b"[]",
            headers={
                signature.SIGNATURE_HEADER: base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode(),
                signature.TIMESTAMP_HEADER: str(int(time.time())),
            },
        )
    assert r.status_code == 403 and r.json()["message"] == "signature does not match"
