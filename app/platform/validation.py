"""Request bodies declared once, as pydantic models: the same declaration validates the request and
becomes its schema in /openapi.json (app/platform/openapi.py).

Why pydantic (scripts/bench/validation.py compares it per event with the hand-written checks it
replaced and with msgspec; BENCHMARKS.md, "event validation"): about as fast as the hand-written
checks. msgspec is faster but stops at the first problem and names it only inside a message string; the
API promises `422 {errors: [{index, field, message}]}` for every problem, which pydantic reports
structurally. End to end (scripts/bench/ingest.py) the difference is inside the noise.

Errors are translated to the API's contract: one entry per field (the first problem pydantic
reports for it), `index` for an item of a batch, and messages in the API's own words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
)
from pydantic.json_schema import models_json_schema
from pydantic_core import PydanticCustomError

from app.platform import i18n

__all__ = [
    "Body",
    "Integer",
    "LocaleKey",
    "Text",
    "Timestamp",
    "ValidationError",
    "as_json",
    "check",
    "distinct_locales",
    "fail",
    "keyed",
    "plain_int",
    "problems",
    "schema_components",
]


class Body(BaseModel):
    """Base of every request body: unknown fields refused, no coercion ("42" is not 42)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_mode_override="validation")


def fail(kind: str, message: str) -> PydanticCustomError:
    """An error a field validator raises, in the API's words (taken literally: braces in a
    template-help message are not placeholders)."""
    return PydanticCustomError(kind, "{detail}", {"detail": message})


# Every character str.isspace() accepts, as a class body: patterns are both the OpenAPI document's
# (ECMA-262) and the server's (Python re), whose \\s differ (U+0085, U+001C-U+001F, U+FEFF), so
# they spell whitespace out.
SPACE_CLASS = "\\t-\\r\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# Control characters (C0, DEL, C1) and the characters str.splitlines() breaks lines at besides
# them (U+0085 is C1; U+2028, U+2029): text that becomes a mail header must hold none, or the
# email package's folding splits the header and every mail built with it fails.
LINE_BREAK_OR_CONTROL = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029"
NO_NUL = "^[^\\u0000]*$"
NOT_BLANK = f"^[^\\u0000]*[^{SPACE_CLASS}\\u0000][^\\u0000]*$"
NO_CONTROL = f"^[^{LINE_BREAK_OR_CONTROL}]*$"
_PATTERN_MESSAGES = {
    NO_NUL: "must not contain NUL characters",
    NOT_BLANK: "must not be empty or contain NUL characters",
    NO_CONTROL: "must not contain line breaks or control characters",
}


def Text(
    max_length: int, pattern: str = NO_NUL, min_length: int | None = None, message: str | None = None, **field
) -> Any:
    """A string field whose limits are checked and documented from this one declaration; `message`
    says what a value that does not match `pattern` is missing."""
    if message:
        _PATTERN_MESSAGES[pattern] = message
    return Annotated[str, Field(max_length=max_length, min_length=min_length, pattern=pattern, **field)]


_PLAIN_INT = re.compile(r"-?[0-9]+")


def plain_int(text, max_digits: int, signed: bool = False) -> int | None:
    """The integer `text` spells in plain ASCII digits (with a leading '-' when `signed`) of at most
    `max_digits` digits, or None. The one reading of a number from a URL, a form or a header:
    str.isdigit() accepts '²' (int() refuses it) and '٣' (int() reads 3), lstrip('-') lets '--5'
    through to int(), and a long run of digits is no id or hour."""
    if not isinstance(text, str) or not _PLAIN_INT.fullmatch(text) or (text[0] == "-" and not signed):
        return None
    return int(text) if len(text) - (text[0] == "-") <= max_digits else None


def whole_number(value):
    """JSON Schema's integer: 15.0 is 15 (a JSON number with no fraction), True is not."""
    return int(value) if type(value) is float and value.is_integer() else value


def Integer(**field) -> Any:
    # Constraints before the validator: after it, pydantic documents them as unknown keywords.
    return Annotated[int, Field(**field), BeforeValidator(whole_number)]


def documented(extra: dict | Callable[[dict], None], check: Callable[[Any], Any]) -> tuple:
    """Metadata for a rule that is code, not a schema keyword (a time zone, a template grammar):
    `extra` documents it (a schema fragment, or a function amending the schema), `check` enforces it."""
    return Field(json_schema_extra=extra), AfterValidator(check)


# Fields that are objects keyed by the caller (locale tags): a problem inside one is named by its
# path, `translations.pt-BR.label`, and a refused key by `translations.<key>`.
KEYED: set[str] = set()


def keyed(name: str) -> str:
    """Declare a field whose problems are named by their path inside it (see KEYED)."""
    KEYED.add(name)
    return name


def _locale_key(value: str) -> str:
    try:
        return i18n.normalize(value)
    except i18n.LocaleError as exc:
        raise fail("locale", str(exc)) from None


def distinct_locales(value: object) -> object:
    """Before a dict keyed by LocaleKey: two spellings of one tag (`pt_br`, `pt-BR`) would silently
    keep one entry of the two, so they are refused."""
    if isinstance(value, dict):
        seen: dict[str, str] = {}
        for tag in value:
            try:
                one = i18n.normalize(tag)
            except i18n.LocaleError:
                continue  # named by its key's own check
            if one in seen:
                raise fail("duplicate", f"{seen[one]!r} and {tag!r} are the same locale ({one}); give it once")
            seen[one] = tag
    return value


# The document's one declaration of a locale (#/components/schemas/LocaleTag, app/platform/openapi.py):
# every tag Babel knows, in its one spelling, so what the document allows the API accepts (another
# spelling, `pt_br`, is accepted too and stored as `pt-BR`).
LOCALE_REF = {"$ref": "#/components/schemas/LocaleTag"}
LOCALE_SCHEMA = {
    "type": "string",
    "description": "a BCP 47 locale tag Babel knows: `pt-BR`, `de`, `ar` (`pt_br` and `pt-br` are read as `pt-BR`)",
    "enum": list(i18n.known()),
}


# A key that is a locale: a BCP 47 tag normalised with Babel (`pt_br` -> `pt-BR`); unknown or malformed: refused.
def _locale_ref(schema: dict) -> None:
    schema.clear()
    schema.update(LOCALE_SCHEMA)  # the document shows it once, by reference (openapi.py `build`)


LocaleKey = Annotated[str, Field(json_schema_extra=_locale_ref), AfterValidator(_locale_key)]


def _message(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    simple = {
        "missing": "is required",
        "extra_forbidden": "unknown field",
        "string_type": 'must be a string (send numbers as "42")',
        "int_type": "must be an integer",
        "bool_type": "must be true or false",
        "list_type": "must be a list",
        "dict_type": "must be a JSON object",
        "model_type": "must be a JSON object",
        "model_attributes_type": "must be a JSON object",
    }
    if kind in simple:
        return simple[kind]
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        return _PATTERN_MESSAGES.get(str(ctx.get("pattern")), "is not in the documented format")
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} items"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} item(s)"
    if kind in ("greater_than_equal", "less_than_equal"):
        low_high = "at least" if kind == "greater_than_equal" else "at most"
        return f"must be {low_high} {ctx.get('ge', ctx.get('le'))}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    return error["msg"]


def problems(exc: ValidationError, batch_key: str | None = None, root: str = "body") -> list[dict]:
    """{field, message} per field with a problem ({index, field, message} for an item of the list
    under `batch_key`), in the order pydantic found them; a problem with the whole body names `root`."""
    out, seen = [], set()
    for error in exc.errors(include_url=False, include_input=False):
        loc, index = list(error["loc"]), None
        if batch_key and len(loc) >= 2 and loc[0] == batch_key and isinstance(loc[1], int):
            index, loc = loc[1], loc[2:] or ["event"]
        field = str(loc[0]) if loc else root
        if field in KEYED and len(loc) > 1:  # translations.pt-BR.label; a refused key: translations.xx
            field = ".".join(str(part) for part in loc[:3] if part != "[key]")
        if (index, field) in seen:  # unions report once per alternative: the first says enough
            continue
        seen.add((index, field))
        entry = {"field": field, "message": _message(error)}
        out.append(entry if index is None else {"index": index, **entry})
    return out


def check(adapter: TypeAdapter | type[BaseModel], data, **where) -> tuple[Any, list[dict]]:
    """(validated value, []) or (None, problems)."""
    try:
        if isinstance(adapter, TypeAdapter):
            return adapter.validate_python(data), []
        return adapter.model_validate(data), []
    except ValidationError as exc:
        return None, problems(exc, **where)


# A moment in an answer: ISO 8601 as datetime.isoformat() spells it ("+00:00", where pydantic's own
# JSON says "Z"), the spelling every answer of the API has had.
Timestamp = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str, when_used="json")]


def as_json(result: BaseModel) -> Any:
    """A typed result as the API answers it: JSON values, fields by their alias (`from`), and only the
    fields it was given (an optional field left out is absent, not null)."""
    return result.model_dump(mode="json", by_alias=True, exclude_unset=True)


def schema_components(models: list[type[BaseModel]]) -> dict:
    """JSON Schemas of `models` (and the models they use) for #/components/schemas."""
    _, doc = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
    return doc.get("$defs", {})
