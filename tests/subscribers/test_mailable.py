""" "May we mail this address now?" is one definition (app/subscribers/mailable.py) that every
sending path uses: its statements are built from it (read from the source), and one subscriber in
each "may not" state is stopped by each path (real Postgres, the real statements)."""

from __future__ import annotations

import ast
import pathlib
import re
from datetime import UTC, datetime

import pytest

from app.newsletter import rows, test_send
from app.operations import erasure
from app.operations.audit import Operator
from app.platform import db
from app.subscribers import mailable
from app.subscribers.streams import DIGESTS, NEWSLETTERS
from digest import claim, immediate, runs
from tests import factories
from tests.newsletter_support import drain, start

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ("app", "digest", "tracking", "actors")

# Every statement that decides whether mail goes out, and the definition it must be built from.
PATHS = {
    "digest claim (digest/runs.py CLAIM)": (runs.CLAIM, mailable.refusal(DIGESTS)),
    "send-now runs (digest/immediate.py)": (immediate._PASS_SQL, mailable.may_mail(DIGESTS, "s", "%(now)s")),
    "outbox fill by id range (rows.INSERT_RANGE)": (rows.INSERT_RANGE, mailable.refusal(NEWSLETTERS)),
    "outbox fill by user ids (rows.INSERT_USER_IDS)": (rows.INSERT_USER_IDS, mailable.refusal(NEWSLETTERS)),
    "newsletter claim (rows.CLAIM)": (rows.CLAIM, mailable.refusal(NEWSLETTERS, when=" before send")),
}

# The rule's parts, spelled out anywhere else in SQL, would be a second definition. The modules
# below read those columns or the suppression list for other reasons than deciding to mail.
RULE_PARTS = re.compile(
    r"(FROM|JOIN)\s+suppressions\b|unsubscribed_at\s+IS\s+(NOT\s+)?NULL|paused_until\s*[<>]", re.IGNORECASE
)
NOT_A_SENDING_DECISION = {
    "app/subscribers/mailable.py": "the definition itself",
    "app/subscribers/suppressions.py": "the list's owner: rewrites rows (merging spellings)",
    "app/web/admin/suppressions.py": "the dashboard's suppression list",
    "app/subscribers/rekey.py": "rewrites stored addresses (migration 0601)",
    # Prefilters, matching the partial index of migration 0005: who could have a digest at all.
    # The claim (mailable) decides when the run is due; a subscriber filtered here is simply
    # not planned.
    "digest/plan.py": "planning prefilter (the claim decides)",
    "digest/ingest.py": "who may need a send-now run (the send-now pass decides)",
}


def _sql_strings(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_every_sending_statement_is_built_from_the_one_definition():
    for name, (statement, fragment) in PATHS.items():
        assert fragment in statement, f"{name} does not use app/subscribers/mailable.py"


def test_test_sends_use_the_address_part_of_the_definition():
    source = (ROOT / "app/newsletter/test_send.py").read_text()
    assert "mailable.address_refusal(" in source
    assert not RULE_PARTS.search(source)


def test_no_other_module_spells_the_rule_out():
    found = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(RULE_PARTS.search(s) for s in _sql_strings(path)):
                found[rel] = True
    assert set(found) <= set(NOT_A_SENDING_DECISION), sorted(set(found) - set(NOT_A_SENDING_DECISION))


# ---------------------------------------------------------------- behaviour: each state, each path

STATES = ("ok", "unsubscribed", "newsletters_off", "suppressed", "erased", "paused", "cadence_off")


def make_states(cadence: str = "daily") -> dict[str, int]:
    """One subscriber per state; the erased one signed up again after erasure (same address)."""
    ids = {state: factories.subscriber(state, digest_cadence=cadence) for state in STATES}
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id = %s", (ids["unsubscribed"],))
    db.query("UPDATE subscribers SET newsletters_unsubscribed_at = now() WHERE id = %s", (ids["newsletters_off"],))
    db.query("UPDATE subscribers SET paused_until = now() + interval '1 day' WHERE id = %s", (ids["paused"],))
    db.query("UPDATE subscribers SET digest_cadence = 'off' WHERE id = %s", (ids["cadence_off"],))
    factories.suppression("suppressed@example.test", "bounce")
    assert erasure.erase_subscriber("erased", Operator("test"))
    ids["erased"] = factories.subscriber("erased-again", email="erased@example.test", digest_cadence=cadence)
    return ids


def by_id(ids: dict[str, int]) -> dict[int, str]:
    return {sid: state for state, sid in ids.items()}


def test_the_digest_claim_skips_every_state_but_a_newsletter_unsubscribe():
    ids = make_states()
    run_state = {factories.digest_run(sid): state for state, sid in ids.items()}
    with db.raw_cursor() as cur:
        ready, skipped = claim.claim(cur, list(run_state), limit=100, max_attempts=5)
    assert {run_state[r.id] for r in ready} == {"ok", "newsletters_off"}
    assert {run_state[rid]: reason for rid, reason in skipped} == {
        "unsubscribed": "unsubscribed",
        "suppressed": "suppressed",
        "erased": "suppressed",
        "paused": "paused",
        "cadence_off": "cadence changed",
    }


def test_send_now_runs_are_made_only_for_who_may_be_mailed():
    ids = make_states(cadence="immediately")
    for state, sid in ids.items():
        user_id = db.query("SELECT user_id FROM subscribers WHERE id = %s", (sid,))[0][0]
        factories.events(user_id, 1, entity_id=state)
        db.query("INSERT INTO digest_send_now (subscriber_id) VALUES (%s) ON CONFLICT DO NOTHING", (sid,))
    immediate.plan(datetime.now(UTC))
    planned = {sid for (sid,) in db.query("SELECT subscriber_id FROM digest_runs WHERE cadence = 'immediately'")}
    assert {by_id(ids)[sid] for sid in planned} == {"ok", "newsletters_off"}


def newsletter_errors(nl: int, ids: dict[str, int]) -> dict[str, str | None]:
    names = by_id(ids)
    return {
        names[sid]: error
        for sid, status, error in db.query(
            "SELECT subscriber_id, status, error FROM email_log WHERE newsletter_id = %s", (nl,)
        )
        if status == "suppressed" and sid in names
    }


def test_the_outbox_fill_and_the_newsletter_claim_stop_every_newsletter_state(fake, provider):
    factories.subscriber("early")  # the claim's case: states set after the outbox was built
    before = factories.newsletter()
    ids = {state: factories.subscriber(f"{state}-later") for state in STATES if state != "erased"}
    start(before)
    db.query("UPDATE subscribers SET unsubscribed_at = now() WHERE id = %s", (ids["unsubscribed"],))
    db.query("UPDATE subscribers SET newsletters_unsubscribed_at = now() WHERE id = %s", (ids["newsletters_off"],))
    db.query("UPDATE subscribers SET paused_until = now() + interval '1 day' WHERE id = %s", (ids["paused"],))
    db.query("UPDATE subscribers SET digest_cadence = 'off' WHERE id = %s", (ids["cadence_off"],))
    factories.suppression("suppressed-later@example.test", "bounce")
    drain(before, provider)
    assert newsletter_errors(before, ids) == {
        "unsubscribed": "unsubscribed before send",
        "newsletters_off": "unsubscribed from newsletters before send",
        "suppressed": "suppressed before send: bounce",
    }

    ids = make_states()  # the outbox fill's case
    after = factories.newsletter()
    start(after)
    assert newsletter_errors(after, ids) == {
        "unsubscribed": "unsubscribed",
        "newsletters_off": "unsubscribed from newsletters",
        "suppressed": "suppressed: bounce",
        "erased": "suppressed: erased",
    }


@pytest.fixture
def sink(settings):
    from tests.digest_support import sink_as_provider

    with sink_as_provider(settings) as s:
        yield s


def test_test_sends_refuse_suppressed_and_erased_addresses(sink):
    make_states()
    nl = factories.newsletter()
    addresses = [f"{state}@example.test" for state in STATES]
    results = {r.email: r.status for r in test_send.send(nl, addresses)}
    # A test send goes to an address, not to a subscription: only the address's own state counts.
    assert results == {
        **dict.fromkeys(addresses, "sent"),
        "suppressed@example.test": "suppressed",
        "erased@example.test": "suppressed",
    }
