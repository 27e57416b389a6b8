"""Tracking codes: golden fixtures of every version keep resolving (I5), MAC, rotation, forgery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracking import codes

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

FIXTURES = json.loads((Path(__file__).parents[1] / "fixtures" / "tracking_codes.json").read_text())


@pytest.fixture
def golden_key(settings):
    settings(secret_key=FIXTURES["secret_key"], secret_key_fallbacks=())


@pytest.mark.parametrize("entry", FIXTURES["codes"], ids=lambda e: f"v{e['version']}-{e['kind']}-{e['code']}")
def test_golden_code_still_resolves(golden_key, entry):
    if entry["kind"] == "click":
        assert codes.decode_click(entry["code"]) == codes.Click(**entry["expected"])
    else:
        assert codes.decode_open(entry["code"]) == codes.Open(**entry["expected"])


@pytest.mark.parametrize(
    "entry",
    [e for e in FIXTURES["codes"] if e["version"] == codes.CURRENT_VERSION],
    ids=lambda e: f"{e['kind']}-{e['code']}",
)
def test_current_codes_are_written_byte_for_byte_as_the_golden_ones(golden_key, entry):
    """The encoder (varints, the kept keyed MAC) writes exactly what it wrote when they were made."""
    expected = entry["expected"]
    if entry["kind"] == "click":
        assert codes.click_code(expected["link_id"], expected["subscriber_id"]) == entry["code"]
    else:
        code = codes.open_code(expected["mail_kind"], expected["mail_id"], expected["subscriber_id"])
        assert code == entry["code"]


def test_threads_signing_at_once_write_the_same_codes(golden_key):
    """The keyed MAC is copied per code, never shared mid-computation: eight threads agree with one."""
    from concurrent.futures import ThreadPoolExecutor

    def sign(start: int) -> list[str]:
        return [codes.click_code(start + i, i) + codes.open_code("digest", i, start) for i in range(2000)]

    alone = [sign(k * 10_000) for k in range(8)]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(sign, [k * 10_000 for k in range(8)])) == alone


def test_every_code_version_has_golden_fixtures():
    """A new version must come with golden codes (add them, never replace the old ones)."""
    kinds = {(e["version"], e["kind"]) for e in FIXTURES["codes"]}
    for version in codes.CLICK_DECODERS:
        assert (version, "click") in kinds
    for version in codes.OPEN_DECODERS:
        assert (version, "open") in kinds
    assert codes.CURRENT_VERSION in codes.CLICK_DECODERS


def test_golden_codes_still_resolve_after_key_rotation(settings):
    settings(secret_key="a-brand-new-key", secret_key_fallbacks=(FIXTURES["secret_key"],))
    for entry in FIXTURES["codes"]:
        decode = codes.decode_click if entry["kind"] == "click" else codes.decode_open
        assert decode(entry["code"]) is not None, entry


def test_round_trip_and_version_prefix():
    code = codes.click_code(99, 1234)
    assert code.startswith(codes.CURRENT_VERSION)
    assert codes.decode_click(code) == codes.Click(99, 1234)
    assert codes.decode_click(codes.click_code(5, None)) == codes.Click(5, None)
    assert codes.decode_open(codes.open_code("digest", 3, 4)) == codes.Open("digest", 3, 4)


def test_codes_from_a_removed_key_do_not_verify(settings):
    settings(secret_key="old-key")
    code = codes.click_code(1, 2)
    settings(secret_key="new-key", secret_key_fallbacks=())
    assert codes.decode_click(code) is None


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "1",
        "9AQFeAy5kaa30hoVu",
        "1AQFeAy5kaa30hoVv",
        "1AQFeAy5kaa30ho",
        "1AQFe+y5kaa30hoVu",
        "1" + "A" * 300,
        "legacy-code",
        "1!!!!",
    ],
)
def test_forged_or_malformed_codes_are_rejected(golden_key, bad):
    assert codes.decode_click(bad) is None
    assert codes.decode_open(bad) is None


def test_click_and_open_codes_are_not_interchangeable():
    assert codes.decode_open(codes.click_code(1, 2)) is None
    assert codes.decode_click(codes.open_code("newsletter", 1, 2)) is None


def test_flipping_any_character_breaks_the_mac():
    code = codes.click_code(77, 88)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(1, len(code)):
        for repl in "Ab":
            if code[i] == repl:
                continue
            forged = code[:i] + repl + code[i + 1 :]
            assert codes.decode_click(forged) in (None,), (i, forged)
    assert all(c in alphabet for c in code)
