"""Array parameters written as one literal (app/platform/db.py pg_array, pg_text_array): whatever the
strings hold, Postgres reads back exactly the values it was given, as psycopg2's own ARRAY[...] would."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.platform import db

# Text Postgres can hold: any character but NUL and lone surrogates (neither could be sent at all).
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
HOSTILE = [
    "",
    " ",
    " padded ",
    "NULL",
    "null",
    '"',
    '""',
    "\\",
    "\\\\",
    '\\"',
    "{",
    "}",
    "{}",
    "{a,b}",
    ",",
    "a,b",
    "'",
    "tab\there",
    "line\nbreak",
    "\r\n",
    'https://example.test/p/1?a=1&b="2"#x',
    "ünïcødé ✓ 🚀 עברית",
]


def read_back(values: list[str | None]) -> list[str | None]:
    return db.query("SELECT %s::text[]", (db.pg_text_array(values),))[0][0]


def test_hostile_strings_and_nulls_arrive_as_they_were():
    values: list[str | None] = [*HOSTILE, None, *HOSTILE[::-1]]
    assert read_back(values) == values
    assert read_back([]) == []
    assert read_back([None]) == [None]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), TEXT), max_size=12))
def test_any_strings_arrive_as_psycopg2_would_send_them(values):
    assert read_back(values) == db.query("SELECT %s::text[]", (values,))[0][0] == values


def test_snapshots_and_ids_as_literals():
    snapshot = db.query("SELECT pg_current_snapshot()::text")[0][0]
    got = db.query(
        "SELECT %s::pg_snapshot[]::text[], %s::bigint[]", (db.pg_text_array([snapshot, None]), db.pg_array([1, 2**62]))
    )
    assert got[0] == ([snapshot, None], [1, 2**62])
