"""Everything a stranger can reach without an API key answers 4xx (or its documented page), never a
5xx, and logs no traceback — whatever the path, headers or body. Plus the cheap rejection of junk:
unknown keys and codes cost no database round trip once seen.

The app runs in process (TestClient, raise_server_exceptions: an unhandled exception fails the
test outright) over the real Postgres and Redis; one test drives a real uvicorn with raw bytes for
what a client library would refuse to send.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from urllib.parse import quote, urlsplit

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from starlette.testclient import TestClient

from app.platform import apikeys, db, http, negcache, tokens
from app.web import app
from tests import factories
from tests.conftest import auth, wait_for
from tracking import codes, links, recorder, resolve

pytestmark = pytest.mark.varies_input("hostile paths, headers and bodies from strangers: the pooled request path")

FUZZ = hsettings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

# Characters that str.isdigit() / int() treat in surprising ways, and bytes that break parsers.
ODD_DIGITS = ["\u0663", "\uff13", "\u00b2", "\u00b9", "\u2460", "\u07c0", "\U0001d7d9", "\u0e53"]
HOSTILE_PIECES = ODD_DIGITS + [
    "%00",
    "%ff",
    "%fe%ff",
    "%0A",
    "%0D%0A",
    "%C0%AE",
    "%2F",
    "%25",
    "%",
    "%%",
    "%u0000",
    "\x00",
    "\n",
    "\t",
    " ",
    "..",
    ".",
    "..%2F",
    "\ud7ff",
    "\ufffd",
    "\U0001f600",
    "9" * 25,
    "9" * 5000,
    "-1",
    "1e999",
    "nk_",
    "1",
    "1A",
    "=",
    "?",
    "#",
    ";",
    "'",
    '"',
    "<script>",
    "\u202e",
    "\u0000\u0000",
]
CONTENT_LENGTHS = [
    b"\xb2",
    b"\xb3",
    b"\xb9",
    b"-1",
    b"-0",
    b"1e3",
    b"0x10",
    b" 1",
    b"1 1",
    b"+5",
    b"",
    b"9" * 25,
    b"9" * 5000,
    b"\xef\xbc\x93",
    b"\xd9\xa3",
    b"nan",
    b"0" * 100 + b"3",
]
CONTENT_TYPES = [
    "",
    "application/json",
    "application/json; charset=utf-16",
    "text/plain",
    "multipart/form-data",
    "multipart/form-data; boundary=",
    "multipart/form-data; boundary=\x00",
    "multipart/form-data; boundary=" + "b" * 5000,
    "application/x-www-form-urlencoded; charset=\xff",
    "application/x-www-form-urlencoded",
    "*/*",
    "\x00",
    ";;;;",
    "application/json;" * 200,
]
XFF = [
    "",
    ",",
    ",,,,",
    "unknown",
    "::::",
    "1.2.3.4.5",
    "256.1.1.1",
    "fe80::1%eth0",
    "[::1]:x",
    "\x00",
    "1.2.3.4, " * 1000,
    "\u00b2.1.1.1",
    "127.0.0.1",
    "-1",
    "9" * 5000,
    "[",
    "]:80",
    "1.2.3.4:99999999999",
]


# ---------------------------------------------------------------- plumbing


@pytest.fixture
def public():
    """A client with no API key. raise_server_exceptions: an unhandled error fails the test."""
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """Whatever a case answered, nothing may have logged an exception at ERROR or above."""
    caplog.set_level(logging.INFO)
    resolve.clear_caches()
    yield
    resolve.clear_caches()
    recorder.recorder().flush()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert not bad, "tracebacks logged: " + "; ".join(f"{r.name}: {r.getMessage()}" for r in bad[:5])


def check(response, *allowed: int) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if allowed:
        assert response.status_code in allowed, (response.status_code, response.text[:300])


def path_of(segment: str) -> str:
    """A URL path segment as a hostile client writes it: raw percent-escapes stay raw (so %ff and
    %00 reach the server undecoded), everything else is UTF-8 escaped so the URL is sendable."""
    return quote(segment, safe="%;=?#'\"<>.-_~!$&()*+,:@")


def click_code_for_new_link() -> str:
    rewriter = links.LinkRewriter("newsletter", factories.newsletter_row())
    html = rewriter.rewrite('<a href="https://example.com/">x</a>', None)
    return html.split("/c/", 1)[1].split('"', 1)[0]


ROUTES = ["/c/{}", "/o/{}.gif", "/u/{}", "/preferences/{}", "/{}", "/static/{}", "/webhooks/{}", "/healthz/{}"]
segments = st.lists(st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(max_size=12)), min_size=1, max_size=6).map(
    "".join
)


# ---------------------------------------------------------------- path parameters


@FUZZ
@given(segment=segments, method=st.sampled_from(["GET", "HEAD"]), route=st.sampled_from(ROUTES))
def test_hostile_path_parameters_get_4xx(public, segment, method, route):
    r = public.request(method, route.format(path_of(segment)), follow_redirects=False)
    check(r)
    if route in ("/c/{}", "/o/{}.gif", "/u/{}", "/preferences/{}"):
        assert r.status_code == 404  # the page, the pixel, or the router's own 404 (a decoded '/')


@FUZZ
@given(mutation=st.tuples(st.integers(0, 40), st.sampled_from(HOSTILE_PIECES)))
def test_mutated_real_codes_and_tokens_get_4xx(public, mutation):
    """Near misses of valid codes and tokens: the parsers' edge cases, not the router's."""
    code = codes.click_code(123, 456)
    pixel = codes.open_code("newsletter", 7, 8)
    token = tokens.make("unsubscribe", 10**17, 1)
    at, piece = mutation
    for route, valid in (("/c/{}", code), ("/o/{}.gif", pixel), ("/u/{}", token), ("/preferences/{}", token)):
        mutated = path_of(valid[:at] + piece + valid[at:])
        # 307: a decoded '/' at the end, and the router's redirect_slashes drops it.
        check(public.get(route.format(mutated), follow_redirects=False), 404, 307)


@pytest.mark.parametrize("route", ROUTES)
def test_every_hostile_piece_on_every_route(public, route):
    """The same pieces, each alone and glued to a real-looking code: deterministic, every one."""
    for piece in HOSTILE_PIECES:
        for segment in (piece, "1AAAAAAAAAAAAAAAAAA" + piece, piece + "x" * 20):
            for method in ("GET", "HEAD", "POST"):
                check(public.request(method, route.format(path_of(segment)), follow_redirects=False))


@pytest.mark.parametrize(
    "path",
    [
        "/c/%00",
        "/c/abc%00",
        "/c/a%00b",
        "/c/%ff",
        "/c/%fe%ff%00",
        "/c/" + "%00" * 300,
        "/c/1AAAAAAAAAAAAAAAAAA%0A",
        "/o/1AAAAAAAAAAAAAAAAAA%0A.gif",
        "/o/1AAAAAAAAAAAAAAAAA%0A.gif",
        "/c/" + quote("\u0663\uff13\u00b2"),
        "/u/%00",
        "/u/a.b%00",
        "/u/" + quote("\u00b2.\u00b2"),
        "/preferences/a.%ff",
        "/preferences/" + quote("MQ.\u0663"),
        "/c/" + "9" * 5000,
        "/o/" + "9" * 5000 + ".gif",
        "/u/" + "a" * 8000,
        "/preferences/" + "a." * 4000,
        "/c/" + "x" * 30000,
        "/nope",
        "/nope/%00",
        "/%ff%fe",
        "/static/..%2F..%2Fconfig.py",
        "/static/%00",
        "/webhooks/sendgrid/%00",
    ],
)
def test_regression_paths(public, path):
    check(public.get(path, follow_redirects=False), 404, 405)


def test_regression_trailing_newline_in_codes():
    # "$" matched before a final "\n", then the canonical-bits check raised KeyError('\n').
    assert codes.decode_click("1AAAAAAAAAAAAAAAAAA\n") is None
    assert codes.decode_open("1AAAAAAAAAAAAAAAAA\n") is None


def test_regression_token_ids_are_ascii_bigints(settings):
    # A MAC-valid token (e.g. minted under an old key) with '²' or a huge id must not reach int()/Postgres.
    for sid in ("\u00b2", "\u0663", "9" * 30):
        raw = f"v1:{sid}:1".encode()
        token = f"{tokens._b64(raw)}.{tokens._b64(tokens._mac(tokens.config.get().secret_key, 'unsubscribe', raw))}"
        assert tokens.verify("unsubscribe", token) is None


def test_regression_verified_code_with_id_past_bigint_is_404(public):
    check(public.get("/c/" + codes.click_code(2**64, None), follow_redirects=False), 404)


# ---------------------------------------------------------------- the pages' forms


@pytest.fixture
def page_tokens():
    sid = factories.subscriber("fz", "fz@example.com")
    return sid, tokens.make("unsubscribe", sid), tokens.make("preferences", sid)


form_bodies = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "action",
                    "csrf_token",
                    "List-Unsubscribe",
                    "digest_hour",
                    "pause_days",
                    "digest_weekday",
                    "timezone",
                    "shown_category",
                    "category",
                    "\x00",
                    "",
                ]
            ),
            st.one_of(st.sampled_from(HOSTILE_PIECES + ["save", "resubscribe", "One-Click"]), st.text(max_size=20)),
        ),
        max_size=8,
    ).map(lambda pairs: "&".join(f"{path_of(k)}={path_of(v)}" for k, v in pairs).encode("utf-8", "surrogatepass")),
)


@FUZZ
@given(body=form_bodies, content_type=st.sampled_from(CONTENT_TYPES), page=st.sampled_from(["/u/", "/preferences/"]))
def test_hostile_form_posts_get_4xx(public, page_tokens, body, content_type, page):
    _sid, unsub, prefs = page_tokens
    token = unsub if page == "/u/" else prefs
    headers = {"content-type": content_type.encode("latin-1", "replace")} if content_type else {}
    r = public.post(page + token, content=body, headers=headers, follow_redirects=False)
    check(r)  # a one-click POST unsubscribes (200); anything malformed is 4xx


@FUZZ
@given(
    hour=st.sampled_from(HOSTILE_PIECES + ["7", "-3", "24"]),
    weekday=st.sampled_from(HOSTILE_PIECES + ["mon"]),
    pause=st.sampled_from(HOSTILE_PIECES + ["3", "0", "366"]),
    tz=st.sampled_from(HOSTILE_PIECES + ["Europe/Lisbon", "../../etc/passwd", "UTC\x00"]),
)
def test_preference_form_with_a_valid_csrf_token_and_hostile_values(public, page_tokens, hour, weekday, pause, tz):
    """Past the CSRF check, where the values are parsed: odd digits and huge numbers are 422s."""
    _sid, _unsub, prefs = page_tokens
    page = public.get(f"/preferences/{prefs}")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    r = public.post(
        f"/preferences/{prefs}",
        follow_redirects=False,
        data={
            "csrf_token": csrf,
            "action": "save",
            "digest_hour": hour,
            "digest_weekday": weekday,
            "pause_days": pause,
            "timezone": tz,
        },
    )
    check(r, 303, 422)


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "\uff13", "9" * 5000, "-" + "9" * 5000])
def test_regression_odd_digits_in_preference_numbers_are_422(public, page_tokens, value):
    _sid, _unsub, prefs = page_tokens
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', public.get(f"/preferences/{prefs}").text).group(1)
    for field in ("digest_hour", "digest_weekday", "pause_days"):
        r = public.post(
            f"/preferences/{prefs}", data={"csrf_token": csrf, "action": "save", field: value}, follow_redirects=False
        )
        check(r, 422)


@pytest.mark.parametrize("length", CONTENT_LENGTHS)
@pytest.mark.parametrize("page", ["/u/", "/preferences/"])
def test_regression_hostile_content_length_on_forms(public, page_tokens, page, length):
    _sid, unsub, prefs = page_tokens
    r = public.post(
        page + (unsub if page == "/u/" else prefs),
        content=b"List-Unsubscribe=One-Click",
        headers={"content-length": length},
        follow_redirects=False,
    )
    check(r, 200, 400, 403, 413)


def test_one_click_still_works_in_both_encodings(public, page_tokens):
    sid, unsub, _prefs = page_tokens
    check(public.post(f"/u/{unsub}", data={"List-Unsubscribe": "One-Click"}), 200)
    check(public.post(f"/u/{unsub}", files={"List-Unsubscribe": (None, "One-Click")}), 200)
    assert db.query("SELECT unsubscribed_at IS NOT NULL FROM subscribers WHERE id = %s", (sid,)) == [(True,)]


# ---------------------------------------------------------------- the SendGrid webhook

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.sampled_from(HOSTILE_PIECES),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30,
)


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    return b'[{"a":' * depth + leaf + b"}]" * depth


RAW_WEBHOOK_BODIES = [
    b"",
    b"[",
    b"]",
    b"\x00",
    b"\xff\xfe[\x00]",
    b"null",
    b"1",
    b'"x"',
    b"[]",
    b"{}",
    b"[1]",
    b"[[]]",
    b"[" * 100_000,
    b"{" * 100_000,
    b'{"a":' * 50_000,
    nested(40),
    nested(100),
    nested(300),
    nested(1000),
    b'[{"a":' + b"9" * 100_000 + b"}]",
    b'[{"a":' + b"9" * 30 + b"}]",
    b"[1e999]",
    b"[-1e999]",
    b"[NaN]",
    b"[Infinity]",
    b'[{"a":"\\ud800"}]',
    b'[{"email":"\xff"}]',
    b'[{"sg_event_id":"\\u0000"}]',
    nested(300, b"9" * 5000),
    b'[{"a":[' + b"9" * 25 + b"]}]" * 1,
    b"[" + b"[]," * 20_000 + b"[]]",
    b'[{"sg_event_id":' + b"1" * 300 + b',"event":[],"email":{}}]',
    b'{"event":"bounce","email":"\x00"}',
]


@pytest.mark.parametrize("body", RAW_WEBHOOK_BODIES, ids=lambda b: f"{b[:12]!r}..{len(b)}")
def test_regression_webhook_bodies(public, body):
    r = public.post("/webhooks/sendgrid", content=body)
    check(r, 200, 400, 413)
    if r.status_code == 400:
        assert r.json()["error"] == "malformed_json" and r.json()["message"]


def test_too_deep_webhook_body_is_400_naming_the_problem(public):
    r = public.post("/webhooks/sendgrid", content=nested(300))
    assert r.status_code == 400 and "nested deeper than" in r.json()["message"]
    assert public.post("/webhooks/sendgrid", content=nested(http.MAX_JSON_DEPTH // 2 - 1)).status_code == 200


@FUZZ
@given(
    body=st.one_of(json_values.map(lambda v: __import__("json").dumps(v).encode()), st.binary(max_size=200)),
    content_type=st.sampled_from(CONTENT_TYPES),
    length=st.sampled_from([None] + CONTENT_LENGTHS),
    xff=st.sampled_from(XFF),
    signature=st.sampled_from([None, "", "\x00", "a" * 5000, "%%%", "MEUCIQ=="]),
    timestamp=st.sampled_from([None, "", "\u00b2", "9" * 5000, "-1", "1700000000", "0x10"]),
)
def test_hostile_webhook_requests_get_4xx(public, body, content_type, length, xff, signature, timestamp):
    headers = {
        "content-type": content_type.encode("latin-1", "replace"),
        "x-forwarded-for": xff.encode("utf-8", "surrogatepass"),
    }
    if length is not None:
        headers["content-length"] = length
    for name, value in ((signature_header(), signature), (timestamp_header(), timestamp)):
        if value is not None:
            headers[name] = value.encode("utf-8")
    check(public.post("/webhooks/sendgrid", content=body, headers=headers), 200, 400, 403, 413)


def signature_header() -> str:
    from tracking import signature

    return signature.SIGNATURE_HEADER


def timestamp_header() -> str:
    from tracking import signature

    return signature.TIMESTAMP_HEADER


def test_signed_webhook_refuses_hostile_signature_headers_with_403(public, settings):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public_der = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    import base64

    settings(sendgrid_webhook_public_key=base64.b64encode(public_der).decode())
    for sig, ts in [("\x00", "\u00b2"), ("a" * 5000, "9" * 5000), ("MEUCIQ==", str(int(time.time()))), ("%", "-1")]:
        r = public.post(
            "/webhooks/sendgrid",
            content=b"[]",
            headers={signature_header(): sig.encode("utf-8"), timestamp_header(): ts.encode("utf-8")},
        )
        check(r, 403)


# ---------------------------------------------------------------- headers on every public route


@FUZZ
@given(
    route=st.sampled_from(["/healthz", "/openapi.json", "/nope", "/c/x", "/o/x.gif", "/static/pages.css"]),
    xff=st.lists(st.sampled_from(XFF), max_size=3),
    length=st.sampled_from([None] + CONTENT_LENGTHS),
    content_type=st.sampled_from(CONTENT_TYPES),
    ua=st.sampled_from(["", "\x00", "\xff" * 600, "bot" * 1000]),
    peer=st.sampled_from(["127.0.0.1", "192.0.2.1", "testclient"]),
)
def test_hostile_headers_on_get_routes(route, xff, length, content_type, ua, peer):
    headers = [(b"x-forwarded-for", v.encode("utf-8", "surrogatepass")) for v in xff]
    headers += [(b"content-type", content_type.encode("latin-1", "replace")), (b"user-agent", ua.encode("latin-1"))]
    if length is not None:
        headers.append((b"content-length", length))
    # Without lifespan on purpose: a client per peer address, sharing the process-wide app.
    r = TestClient(app, client=(peer, 50000), raise_server_exceptions=True).get(route, headers=headers)
    check(r)


def test_click_with_hostile_forwarded_headers_records_a_valid_inet(public, caplog):
    code = click_code_for_new_link()
    dropped = recorder.recorder().dropped
    for peer in ("127.0.0.1", "192.0.2.1"):
        c = TestClient(app, client=(peer, 50000), raise_server_exceptions=True)
        for xff in XFF:
            check(
                c.get(
                    f"/c/{code}",
                    headers={"x-forwarded-for": xff.encode("utf-8", "surrogatepass")},
                    follow_redirects=False,
                ),
                302,
            )
    recorder.recorder().flush()
    assert db.query("SELECT count(*) FROM email_link_history") == [(2 * len(XFF),)]
    # No row Postgres refuses (an IPv6 zone, junk): no batch fell back to row-by-row writing.
    assert recorder.recorder().dropped == dropped
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


def test_untrusted_peer_cannot_choose_the_recorded_ip(public, settings):
    code = click_code_for_new_link()
    stranger = TestClient(app, client=("192.0.2.50", 50000))
    stranger.get(f"/c/{code}", headers={"X-Forwarded-For": "203.0.113.9"}, follow_redirects=False)
    via_lb = TestClient(app, client=("10.0.0.5", 50000))
    settings(forwarded_allow_ips="10.0.0.0/8")
    via_lb.get(
        f"/c/{code}",
        headers=[("X-Forwarded-For", "6.6.6.6, 203.0.113.9"), ("X-Forwarded-For", "10.1.1.1")],
        follow_redirects=False,
    )
    recorder.recorder().flush()
    assert db.query("SELECT host(ip) FROM email_link_history ORDER BY id") == [("192.0.2.50",), ("203.0.113.9",)]


# ---------------------------------------------------------------- generated from the OpenAPI document

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.include(path_regex="^/(c|o|healthz|webhooks)").parametrize()
@hsettings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_public_routes_from_the_openapi_document(case):
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])


# ---------------------------------------------------------------- the real server, raw bytes


def raw_request(base_url: str, request: bytes) -> bytes:
    host, port = urlsplit(base_url).hostname, urlsplit(base_url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


RAW_REQUESTS = [
    b"GET /c/%00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /c/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /o/1AAAAAAAAAAAAAAAAAA%0A.gif HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /u/%00.%00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /preferences/" + b"A" * 6000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n"
    b"Connection: close\r\n\r\n[]",
    b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n[]",
    b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\nConnection: close\r\n\r\n[]",
    b"POST /webhooks/sendgrid HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    b"7\r\n[[[[[[[\r\n0\r\n\r\n",
    b"GET /c/x HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: \xff\x00\r\nConnection: close\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: ,,,\r\n"
    b"Connection: close\r\n\r\n",
]


def test_real_server_answers_raw_hostile_requests_without_5xx(live_server):
    for request in RAW_REQUESTS:
        answer = raw_request(live_server, request)
        if answer:  # the HTTP parser may just close a connection it cannot read: that is fine
            status = int(answer.split(b" ", 2)[1])
            assert status < 500, (request[:80], answer[:300])


# ---------------------------------------------------------------- cheap rejection of junk


@pytest.fixture
def db_queries(monkeypatch):
    """Counts statements per table through the one function every lookup here uses (the database
    itself stays real: this is instrumentation, not a stand-in)."""
    seen: list[str] = []
    real = db.query

    def counting(sql, *args, **kwargs):
        seen.append(sql)
        return real(sql, *args, **kwargs)

    monkeypatch.setattr(db, "query", counting)
    return lambda table: sum(table in sql for sql in seen)


def test_unknown_api_key_costs_one_query_then_none(public, settings, db_queries):
    settings(api_key_cache_seconds=60)
    junk = {"Authorization": "Bearer nk_" + "x" * 43}
    for _ in range(20):
        check(public.post("/v1/events", json={}, headers=junk), 401)
    assert db_queries("api_keys") == 1


def test_keys_not_shaped_like_ours_cost_no_query(public, settings, db_queries):
    settings(api_key_cache_seconds=60)
    for key in ("x", "nk_", "nk_short", "nk_" + "\u0663" * 43, "nk_" + "x" * 500, "Bearer", "\x00" * 50):
        check(public.post("/v1/events", json={}, headers={"Authorization": f"Bearer {key}".encode()}), 401)
    assert db_queries("api_keys") == 0


def test_a_key_created_after_being_seen_unknown_works_within_the_cache_bound(public, settings):
    settings(api_key_cache_seconds=0.5)
    key = "nk_" + "k" * 43
    check(public.get("/v1/subscribers/x", headers=auth(key)), 401)
    # Created by another process (the CLI): this process only learns it when the entry expires.
    db.query(
        "INSERT INTO api_keys (name, scope, key_prefix, key_hash) VALUES ('late', 'admin', %s, %s)",
        (key[:10], apikeys.hash_key(key)),
    )
    wait_for(
        lambda: public.get("/v1/subscribers/x", headers=auth(key)).status_code == 404,
        timeout=5,
        what="the new key to work",
    )


def test_junk_tracking_codes_cost_one_query_then_none(public, db_queries):
    forged = "1" + "A" * 24  # versioned shape, wrong MAC: may still be a legacy code
    for _ in range(20):
        check(public.get(f"/c/{forged}", follow_redirects=False), 404)
    assert db_queries("legacy_link_codes") == 1
    for junk in ("%00", "a%00b", "a%20b", "%0A", "x" * 201):  # cannot be a legacy code at all
        check(public.get(f"/c/{junk}", follow_redirects=False), 404)
    assert db_queries("legacy_link_codes") == 1


def test_verified_code_without_a_link_costs_one_query_then_none(public, db_queries):
    gone = codes.click_code(987654, 1)
    for _ in range(20):
        check(public.get(f"/c/{gone}", follow_redirects=False), 404)
    assert db_queries("email_links") == 1
    assert public.get(f"/o/{codes.open_code('newsletter', 1, 1)[:-1]}x.gif").status_code == 404
    assert db_queries("email_links") == 1


def test_negative_cache_is_bounded_and_expires():
    cache = negcache.NegativeCache(max_size=3, ttl=0.2)
    for key in "abcd":
        cache.add(key)
    assert len(cache) == 3 and "a" not in cache and "d" in cache  # the oldest went first
    wait_for(lambda: "d" not in cache, timeout=5, what="expiry")
    off = negcache.NegativeCache(max_size=3, ttl=0)
    off.add("x")
    assert "x" not in off and len(off) == 0
