"""One address, one identity (I8, issue 25.4): the canonical form (app/platform/addresses.py) and every path
that compares addresses — digest claim, send-now planning, newsletter outbox and claim, test sends,
webhook application, admin suppressions, legacy link import — treating the case, IDNA (U-label /
A-label) and full-width spellings of an address as one."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import peewee
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from app.operations.audit import Operator
from app.operations.suppressions import remove_suppression
from app.platform import addresses, db
from app.platform.addresses import canonical
from app.subscribers import records as subscribers
from app.web.admin import suppressions as admin_suppressions
from digest import immediate
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.digest_support import run_row, sink_as_provider
from tests.newsletter_support import counts, drain, start
from tracking import legacy, webhook_apply, webhook_intake

CANONICAL = "ana@xn--bcher-kva.example"
# (how the subscriber gave it, how SendGrid / an operator / a file names it): case, U-label vs
# A-label and full-width forms on both sides.
PAIRS = [
    ("Ana@Bücher.example", "ana@xn--bcher-kva.example"),
    ("ANA@XN--BCHER-KVA.EXAMPLE", "ａｎａ@ｂüｃｈｅｒ.example"),
    ("ａｎａ@bücher.example", "ANA@BÜCHER.EXAMPLE"),
]


# -- the definition --------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [s for pair in PAIRS for s in pair])
def test_every_spelling_has_one_canonical_form(spelling):
    assert canonical(spelling) == CANONICAL


@pytest.mark.parametrize(
    "given_, expected",
    [
        ("Ana@Example.COM", "ana@example.com"),
        ("ANA@example.com", "ana@example.com"),  # README's table
        ("ana@bücher.example", CANONICAL),
        ("Ana@BÜCHER.example", CANONICAL),
        ("ana@xn--bcher-kva.example", CANONICAL),
        ("ａｎａ@ｅｘａｍｐｌｅ.ｃｏｍ", "ana@example.com"),
        ("Ana.Lima+x@Example.COM", "ana.lima+x@example.com"),  # case, in both parts
        ("ｊｏ@ｅｘａｍｐｌｅ.ｃｏｍ", "jo@example.com"),  # full-width (NFKC) in both parts
        ("JÖ@example.com", "jö@example.com"),  # a Unicode local part stays Unicode
        ("ana@straße.de", "ana@xn--strae-oqa.de"),  # UTS 46 non-transitional: ß is kept
        ("Straße@x.de", "strasse@x.de"),  # local part: case folding maps ß
        ("ana@example。com", "ana@example.com"),  # an ideographic full stop is a dot
        ("ana@" + "ü" * 70 + ".com", "ana@" + "ü" * 70 + ".com"),  # not IDNA (stored before 25.4): folded
    ],
)
def test_canonical_form_examples(given_, expected):
    assert canonical(given_) == expected


@hypothesis_settings(max_examples=3000, deadline=None)
@given(st.text())
def test_the_canonical_form_is_its_own_canonical_form(text):
    assert canonical(canonical(text)) == canonical(text)


@hypothesis_settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_an_ascii_address_is_its_lower_case_form(text):
    """What migration 0600's triggers compute in SQL for rows written without the key."""
    assert canonical(text) == text.lower()


def test_a_row_written_without_its_key_gets_it_from_the_trigger_if_ascii_or_is_refused():
    """Writers that do not know the column (a seeding script, psql, the previous release during a
    deploy): an ASCII address is keyed by migration 0600's trigger, exactly as the definition keys
    it; a non-ASCII one cannot be stored without its key (constraint of migration 0601)."""
    samples = ["Ana@Example.COM", "x_y@A_B.example", "a@-bad-.COM", "no-at-sign", "A@XN--BCHER-KVA.EX", "I@x.test"]
    for i, email in enumerate(samples):
        db.query("INSERT INTO subscribers (user_id, email) VALUES (%s, %s)", (f"s{i}", email))
    assert dict(db.query("SELECT email, canonical_email FROM subscribers")) == {e: canonical(e) for e in samples}
    db.query("UPDATE subscribers SET email = 'New.Address@Example.ORG' WHERE user_id = 's0'")
    assert db.query("SELECT canonical_email FROM subscribers WHERE user_id = 's0'") == [("new.address@example.org",)]
    with pytest.raises(peewee.IntegrityError, match="subscribers_canonical_email_present"):
        db.query("INSERT INTO subscribers (user_id, email) VALUES ('u', 'Ana@Bücher.example')")


def test_mail_goes_to_the_address_as_given_with_the_domain_of_the_canonical_form():
    """A bounce names the address we sent to: its canonical form must be the subscriber's."""
    assert addresses.sendable("Ana@Straße.de") == "Ana@xn--strae-oqa.de"
    assert canonical(addresses.sendable("Ana@Straße.de")) == canonical("Ana@Straße.de")
    assert addresses.sendable("Ana@Example.COM") == "Ana@Example.COM"


# -- invalid IDNA is refused at the door -----------------------------------------------------------

INVALID_IDNA = [
    "ana@" + "ü" * 70 + ".com",
    "ana@a_b.example",
    "ana@-ab.example",
    "ana@ab--cd.example",
    "ana@xn--zz.example",
    "ana@bü_cher.example",
]


@pytest.mark.parametrize("address", INVALID_IDNA)
def test_a_domain_that_is_not_idna_is_a_422_naming_email(client, admin_key, address):
    r = client.put("/v1/subscribers/u1", json={"email": address}, headers=auth(admin_key))
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {
            "field": "email",
            "message": "must be a valid email address: its domain is not a valid internationalised domain name (IDNA)",
        }
    ]
    assert db.query("SELECT count(*) FROM subscribers") == [(0,)]


@pytest.mark.parametrize("address", INVALID_IDNA)
def test_a_test_send_to_a_domain_that_is_not_idna_is_a_422_naming_to(client, admin_key, address):
    nl = factories.newsletter()
    r = client.post(f"/v1/newsletters/{nl}/test", json={"to": ["ok@example.com", address]}, headers=auth(admin_key))
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["to"]


def test_the_openapi_document_says_the_domain_must_be_idna(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for email in (
        schemas["SubscriberInput"]["properties"]["email"],
        schemas["TestSendInput"]["properties"]["to"]["items"],
    ):
        assert "IDNA" in email["description"] and email["format"] == "idn-email"  # what the pattern cannot say


# -- every path compares the canonical form --------------------------------------------------------

_seq = iter(range(1, 10**9))


def webhook_event(event: str, email: str | None, **extra) -> None:
    """Stored as the webhook stores it, then applied as the worker applies it."""
    row = (f"sg-{next(_seq)}", event, email, orjson.dumps({"event": event, "email": email, **extra}).decode())
    with db.raw_cursor() as cur:
        (result,) = webhook_intake.insert_jobs(cur, [[row]])
    assert webhook_apply.apply_events(result.new_ids) == 1


def suppressions() -> list[tuple]:
    return db.query("SELECT email, reason FROM suppressions ORDER BY email")


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings) as s:
        yield s


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_digest_claim_skips_a_subscriber_suppressed_under_another_spelling(sink, stored, reported):
    sid = factories.subscriber("u1", email=stored)
    factories.events("u1", 2)
    rid = factories.digest_run(sid)
    webhook_event("bounce", reported, type="bounce")
    assert suppressions() == [(CANONICAL, "bounce")]
    assert digest_send.process([rid])["skipped"] == 1
    assert (run_row(rid)["status"], run_row(rid)["skip_reason"]) == ("skipped", "suppressed")
    assert sink.messages() == []


@pytest.mark.parametrize("suppressed", [False, True])
@pytest.mark.parametrize("stored, reported", PAIRS)
def test_send_now_planning_skips_a_subscriber_suppressed_under_another_spelling(stored, reported, suppressed):
    sid = factories.subscriber("u1", email=stored, digest_cadence="immediately")
    factories.events("u1", 1)
    db.query("INSERT INTO digest_send_now (subscriber_id) VALUES (%s)", (sid,))
    if suppressed:
        webhook_event("spamreport", reported)
    created, _ = immediate.plan(datetime.now(UTC), sending_now=True)
    assert created == (0 if suppressed else 1)


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_newsletter_outbox_and_claim_suppress_every_spelling(fake, provider, stored, reported):
    factories.subscriber("before", email=stored)
    factories.subscriber("after", email=stored.replace("@", "+2@", 1))
    factories.subscriber("other", email="bo@example.com")
    webhook_event("unsubscribe", reported)  # before the outbox
    nl = factories.newsletter()
    start(nl)
    assert counts(nl) == {"pending": 2, "suppressed": 1}
    webhook_event("bounce", reported.replace("@", "+2@", 1), type="bounce")  # after it: the claim
    drain(nl, provider)
    assert counts(nl) == {"sent": 1, "suppressed": 2}
    assert dict(
        db.query(
            "SELECT s.user_id, e.error FROM email_log e JOIN subscribers s ON s.id = e.subscriber_id "
            "WHERE e.status = 'suppressed'"
        )
    ) == {"before": "suppressed: unsubscribe", "after": "suppressed before send: bounce"}
    assert [m["to"] for m in fake.delivered.values()] == ["bo@example.com"]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_test_send_dedupes_finds_the_subscriber_and_refuses_the_suppressed_by_identity(
    client, admin_key, sink, stored, reported
):
    factories.subscriber("ana", email=stored, name="Ana Lima")
    nl = factories.newsletter(subject="Hello {{name}}")
    answer = client.post(
        f"/v1/newsletters/{nl}/test", json={"to": [reported, stored, "Editor@Example.test"]}, headers=auth(admin_key)
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == [
        {"email": CANONICAL, "status": "sent"},
        {"email": "editor@example.test", "status": "sent"},
    ]
    ana = next(m for m in sink.messages() if "Ana" in m["Subject"])
    assert ana["Subject"] == "[Test] Hello Ana Lima" and "List-Unsubscribe" in ana  # rendered as the subscriber's
    assert sorted(rcpt for _, (rcpt,) in sink.envelopes) == sorted(
        [
            addresses.sendable(reported),  # the first
            "Editor@Example.test",
        ]
    )  # spelling
    webhook_event("bounce", stored, type="bounce")
    answer = client.post(f"/v1/newsletters/{nl}/test", json={"to": [reported]}, headers=auth(admin_key))
    assert answer.json()["results"] == [{"email": CANONICAL, "status": "suppressed"}]


@pytest.mark.parametrize(
    "event, extra, reason",
    [
        ("bounce", {"type": "bounce"}, "bounce"),
        ("spamreport", {}, "spamreport"),
        ("unsubscribe", {}, "unsubscribe"),
        ("dropped", {"reason": "Bounced Address"}, "bounce"),
    ],
)
def test_webhook_suppressions_are_stored_in_canonical_form_once(event, extra, reason):
    for _, reported in PAIRS:
        webhook_event(event, reported, **extra)
    assert suppressions() == [(CANONICAL, reason)]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_webhook_soft_bounces_and_deliveries_find_the_subscriber_under_another_spelling(settings, stored, reported):
    settings(soft_bounce_limit=2)
    sid = factories.subscriber("u1", email=stored)
    webhook_event("deferred", reported, attempt="1")
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(1,)]
    webhook_event("delivered", reported)
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(0,)]
    # custom_args naming the subscriber are trusted: the event's address is theirs, spelled otherwise
    args = {"mail_kind": "newsletter", "mail_id": "5", "subscriber_id": str(sid)}
    webhook_event("deferred", reported, attempt="1", **args)
    webhook_event("deferred", reported, attempt="1", **args)
    assert suppressions() == [(CANONICAL, "soft_bounce")]
    assert db.query("SELECT count FROM mail_event_counts WHERE mail_kind = 'newsletter' AND mail_id = 5") == [(2,)]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_a_digest_event_counts_for_its_run_under_another_spelling(stored, reported):
    sid = factories.subscriber("u1", email=stored)
    rid = factories.digest_run(sid)
    webhook_event("open", reported, mail_kind="digest", mail_id=str(rid), row_id=str(rid), subscriber_id=str(sid))
    assert db.query("SELECT event, count FROM mail_event_counts WHERE mail_kind = 'digest'") == [("open", 1)]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_an_outbox_row_counts_under_another_spelling(stored, reported):
    sid = factories.subscriber("u1", email=stored)
    nl = factories.newsletter()
    row = factories.outbox_row(nl, sid, email=stored)
    webhook_event("open", reported, mail_kind="newsletter", mail_id=str(nl), row_id=str(row))
    assert db.query("SELECT event, count FROM mail_event_counts WHERE mail_kind = 'newsletter'") == [("open", 1)]


def test_webhook_events_are_stored_with_their_canonical_address():
    for _, reported in PAIRS:
        webhook_event("open", reported)
    webhook_event("open", None)
    assert db.query("SELECT DISTINCT canonical_email FROM webhook_events ORDER BY 1") == [(CANONICAL,), (None,)]


def test_an_event_stored_without_its_key_gets_it_when_applied():
    """A web process of the previous release (during a deploy) stores events without the key."""
    ((i,),) = db.query(
        "INSERT INTO webhook_events (sg_event_id, event, email, payload) "
        "VALUES ('old', 'open', 'ANA@BÜCHER.EXAMPLE', '{}') RETURNING id"
    )
    assert db.query("SELECT canonical_email FROM webhook_events") == [(None,)]  # not ASCII: no trigger key
    webhook_apply.apply_events([i])
    assert db.query("SELECT canonical_email FROM webhook_events") == [(CANONICAL,)]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_admin_remove_resets_the_soft_bounces_of_every_spelling(admin_key, stored, reported):
    sid = factories.subscriber("u1", email=stored)
    db.query("UPDATE subscribers SET soft_bounce_count = 3 WHERE id = %s", (sid,))
    webhook_event("bounce", reported, type="bounce")
    ((row,),) = db.query("SELECT id FROM suppressions")
    ((key_id,),) = db.query("SELECT id FROM api_keys")
    assert remove_suppression(Operator("admin-test", key_id), row, "").email == CANONICAL
    assert db.query("SELECT soft_bounce_count FROM subscribers") == [(0,)]


@pytest.mark.parametrize(
    "text",
    [
        "bücher",
        "BÜCHER.EXAMPLE",
        "xn--bcher",
        "ＡＮＡ@",
        "Ana@Bücher.example",
        "ana@xn--bcher-kva.example",
        "@ｂüｃｈｅｒ.example",
    ],
)
def test_admin_search_finds_the_canonical_row_by_any_spelling(text):
    factories.suppression(CANONICAL)
    factories.suppression("bo@example.com")
    found, _ = admin_suppressions.search(text, 1)
    assert [s.email for s in found] == [CANONICAL]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_legacy_link_import_finds_the_subscriber_under_another_spelling(tmp_path, stored, reported):
    sid = factories.subscriber("u1", email=stored)
    csv_file = tmp_path / "legacy.csv"
    csv_file.write_text(f"L1,https://old.example/a,newsletter:1,{reported}\n", encoding="utf-8")
    with open(csv_file, encoding="utf-8") as f:
        report = legacy.import_csv(f)
    assert (report.imported, report.unknown_recipients) == (1, 0)
    assert db.query("SELECT code, subscriber_id FROM legacy_link_codes") == [("L1", sid)]


@pytest.mark.parametrize("stored, reported", PAIRS)
def test_the_api_and_the_preference_writer_store_the_canonical_form(client, admin_key, stored, reported):
    r = client.put("/v1/subscribers/u1", json={"email": stored}, headers=auth(admin_key))
    assert r.status_code == 201 and r.json()["email"] == stored  # stored and sent as given
    assert db.query("SELECT canonical_email FROM subscribers") == [(CANONICAL,)]
    subscribers.update(r.json()["id"], {"email": "Bo@Example.com"})
    assert db.query("SELECT email, canonical_email FROM subscribers") == [("Bo@Example.com", "bo@example.com")]
