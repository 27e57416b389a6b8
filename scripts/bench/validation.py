"""Request validation for POST /v1/events: the pydantic models (digest/ingest.py, one declaration for
checks and /openapi.json) against the hand-written validator they replaced and against msgspec.

    .venv/bin/python scripts/bench/validation.py

Microseconds per event for one 1000-event batch, from the parsed body (what the endpoint gets
from read_json) to rows for the INSERT; and the same with one bad event in the batch, where the
API must name every problem. msgspec is measured only when installed (`pip install msgspec`):
it decodes straight from bytes, so it is timed from the raw body, and it stops at the first problem.
"""

import os
import sys
import timeit
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

from app.platform import config  # noqa: E402
from digest import ingest  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()

# -- the hand-written validator (digest/ingest.py before the models), kept here as the baseline --------
FIELDS = {
    "id": (True, 200),
    "user_id": (True, 200),
    "category": (True, 100),
    "entity_type": (True, 100),
    "entity_id": (True, 200),
    "actor_id": (False, 200),
    "actor_name": (False, 200),
}
ALLOWED = set(FIELDS) | {"payload", "occurred_at"}


def hand_written(event, index, source, errors):
    def err(field, message):
        errors.append({"index": index, "field": field, "message": message})

    if not isinstance(event, dict):
        err("event", "must be a JSON object")
        return None
    before = len(errors)
    for name in sorted(set(event) - ALLOWED):
        err(name, "unknown field")
    values = {}
    for name, (required, max_len) in FIELDS.items():
        value = event.get(name)
        if value is None:
            if required:
                err(name, "is required")
            values[name] = None
            continue
        if not isinstance(value, str):
            err(name, "must be a string")
            continue
        if required and not value.strip():
            err(name, "must not be empty")
        elif len(value) > max_len:
            err(name, f"must be at most {max_len} characters")
        elif "\x00" in value:
            err(name, "must not contain NUL characters")
        values[name] = value
    payload = event.get("payload") or {}
    payload_json = b"{}"
    if not isinstance(payload, dict):
        err("payload", "must be a JSON object")
    else:
        payload_json = orjson.dumps(payload)
        if len(payload_json) > 16 * 1024:
            err("payload", "too large")
        elif b"\\u0000" in payload_json:
            err("payload", "must not contain NUL characters")
    occurred_at = None
    if event.get("occurred_at") is not None:
        try:
            occurred_at = datetime.fromisoformat(event["occurred_at"]).astimezone(UTC)
        except (TypeError, ValueError):
            err("occurred_at", "must be an RFC 3339 timestamp")
    if len(errors) > before:
        return None
    return (
        source,
        values["id"],
        values["user_id"],
        values["category"],
        values["entity_type"],
        values["entity_id"],
        values["actor_id"],
        values["actor_name"],
        payload_json.decode(),
        occurred_at,
        None,
    )  # high_priority: the rows digest/ingest.py builds now end with it


def hand_written_batch(body):
    rows, errors = [], []
    for i, event in enumerate(body["events"]):
        row = hand_written(event, i, "bench", errors)
        if row is not None:
            rows.append(row)
    return rows, errors


try:
    import msgspec
except ImportError:
    msgspec = None
else:

    def _text(n, low=0):
        return Annotated[str, msgspec.Meta(min_length=low, max_length=n)]

    class MsgspecEvent(msgspec.Struct, forbid_unknown_fields=True):
        id: _text(200, 1)
        user_id: _text(200, 1)
        category: _text(100, 1)
        entity_type: _text(100, 1)
        entity_id: _text(200, 1)
        actor_id: _text(200) | None = None
        actor_name: _text(200) | None = None
        payload: dict[str, Any] | None = None
        occurred_at: datetime | None = None

    class MsgspecBatch(msgspec.Struct, forbid_unknown_fields=True):
        events: list[MsgspecEvent]

    _decoder = msgspec.json.Decoder(MsgspecBatch)

    def msgspec_rows(raw):
        try:
            batch = _decoder.decode(raw)
        except msgspec.ValidationError as exc:
            return [], [str(exc)]
        return [
            (
                "bench",
                e.id,
                e.user_id,
                e.category,
                e.entity_type,
                e.entity_id,
                e.actor_id,
                e.actor_name,
                orjson.dumps(e.payload or {}).decode(),
                e.occurred_at,
                None,
            )
            for e in batch.events
        ], []


def event(i: int) -> dict:
    return {
        "id": f"e{i}",
        "user_id": f"u{i % 100}",
        "category": "likes",
        "entity_type": "post",
        "entity_id": f"p{i}",
        "actor_id": f"a{i % 7}",
        "actor_name": "Ana Lima",
        "payload": {"title": "A post about digests", "n": i},
        "occurred_at": "2026-11-21T09:30:00Z",
    }


def per_event_us(fn, n_events: int) -> float:
    return min(timeit.repeat(fn, number=20, repeat=5)) / 20 / n_events * 1e6


def main() -> None:
    good = {"events": [event(i) for i in range(1000)]}
    bad = {"events": [event(i) for i in range(999)] + [{**event(999), "user_id": 42, "surprise": 1}]}
    raw_good, raw_bad = orjson.dumps(good), orjson.dumps(bad)
    assert ingest.validate_body(good, "bench")[0] == hand_written_batch(good)[0]
    assert [e["field"] for e in ingest.validate_body(bad, "bench")[1]] == ["user_id", "surprise"]

    rows = [
        (
            "pydantic models (digest/ingest.py)",
            per_event_us(lambda: ingest.validate_body(good, "bench"), 1000),
            per_event_us(lambda: ingest.validate_body(bad, "bench"), 1000),
            "every problem, by field",
        ),
        (
            "hand-written (before)",
            per_event_us(lambda: hand_written_batch(good), 1000),
            per_event_us(lambda: hand_written_batch(bad), 1000),
            "every problem, by field",
        ),
    ]
    if msgspec is None:
        print("msgspec is not installed: `pip install msgspec` to compare")
    else:
        assert len(msgspec_rows(raw_bad)[1]) == 1
        rows.append(
            (
                "msgspec (from bytes, incl. parse)",
                per_event_us(lambda: msgspec_rows(raw_good), 1000),
                per_event_us(lambda: msgspec_rows(raw_bad), 1000),
                "first problem, in a message",
            )
        )
    parse = per_event_us(lambda: orjson.loads(raw_good), 1000)
    print(f"POST /v1/events validation, 1000-event batch, µs per event (parsing with orjson: {parse:.2f} more)")
    print(f"{'':36s} {'valid':>8s} {'one bad':>8s}  reports")
    for name, ok, one_bad, reports in rows:
        print(f"{name:36s} {ok:8.2f} {one_bad:8.2f}  {reports}")
    ours, hand = rows[0], rows[1]
    peer = rows[2] if len(rows) > 2 else None
    for figure, col in (("validation time per event, valid batch", 1), ("validation time per event, one bad event", 2)):
        record(
            "event validation (POST /v1/events, 1000-event batch)",
            figure,
            ours[col],
            "µs",
            baseline=hand[col],
            baseline_label="hand-written validator (before)",
            higher_is_better=False,
            batch=1000,
            orjson_parse_us=round(parse, 3),
            msgspec_us=round(peer[col], 3) if peer else "not installed",
        )


if __name__ == "__main__":
    main()
