"""The one Mustache implementation, for digests and newsletters: chevron's tokenizer (the grammar),
and the token list compiled into one Python function per template instead of chevron's interpreter.

chevron re-walks its token list with a scope search per tag and string concatenation; compiling the
SAME tokens into straight-line Python once per template version renders several times faster
(scripts/bench/render.py measures it, BENCHMARKS.md has the figures), which matters on the digest
hot path, and tests check the output equals chevron's.

Supported: variables ({{x}}, escaped like chevron: & " < >), {{{x}}} / {{&x}}, sections over lists,
dicts and truthy values, inverted sections, comments, delimiter changes, dotted names, {{.}}. Not
supported (refused at compile time with MustacheError): partials (no file system access from a
template). Names resolve in dict scopes only — never attributes, so {{title}} inside a section over
a string cannot become str.title (a chevron pitfall).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import chevron
from chevron.tokenizer import ChevronError

_MISSING = object()
Token = tuple[str, str]  # (kind, value): chevron's token
Scopes = list[Any]  # the context and the section values around a tag, innermost last


class MustacheError(ValueError):
    pass


def tokenize(source: str) -> tuple[Token, ...]:
    """The template's (kind, value) tokens; MustacheError says what is malformed."""
    try:
        return tuple(chevron.tokenizer.tokenize(source))
    except ChevronError as exc:
        raise MustacheError(str(exc)) from None
    except (IndexError, ValueError):  # chevron's tokenizer on e.g. an empty tag "{{}}"
        raise MustacheError("empty or malformed tag") from None


def tags(tokens: Iterable[Token]) -> list[str]:
    """Every token but the literal text: what must survive a rewrite of the text (CSS inlining)."""
    return [value for kind, value in tokens if kind != "literal"]


def _escape(text: str) -> str:
    if "&" in text:
        text = text.replace("&", "&amp;")
    if "<" in text:
        text = text.replace("<", "&lt;")
    if ">" in text:
        text = text.replace(">", "&gt;")
    if '"' in text:
        text = text.replace('"', "&quot;")
    return text


def _lookup(name: str, scopes: Scopes) -> Any:
    if name == ".":
        return scopes[-1]
    first, _, rest = name.partition(".")
    for scope in reversed(scopes):
        if isinstance(scope, dict) and first in scope:
            value = scope[first]
            break
    else:
        return _MISSING
    if rest:
        for part in rest.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                return _MISSING
    return value


def _text(value: Any) -> str:
    if value is _MISSING or value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _lookup_simple(name: str, scopes: Scopes) -> Any:
    """Innermost dict scope that has `name` (the common case: no dots)."""
    for i in range(len(scopes) - 1, -1, -1):
        scope = scopes[i]
        if type(scope) is dict:
            value = scope.get(name, _MISSING)
            if value is not _MISSING:
                return value
    return None


def _value(name: str, scopes: Scopes) -> Any:
    """None when missing (renders as "" and counts as false in sections)."""
    if name == "." or "." in name:
        value = _lookup(name, scopes)
        return None if value is _MISSING else value
    return _lookup_simple(name, scopes)


def _escaped(value: Any) -> str:
    return _escape(value if type(value) is str else _text(value))


MAX_KEPT_ASCII = 4096  # values an ASCII template keeps written as references (a locale's words repeat)
_ascii_kept: dict[str, str] = {}


def _as_ascii(text: str) -> str:
    """`text` in ASCII, other characters as numeric character references (é as &#233;)."""
    return text.encode("ascii", "xmlcharrefreplace").decode("ascii")


def _escaped_ascii(value: Any) -> str:
    """_escaped, then in ASCII. Writing a reference costs ~50 ns a character, and the words of a
    locale (a footer, a button, "обновления") come back in every mail: each is written once and kept."""
    text = _escape(value if type(value) is str else _text(value))
    if text.isascii():
        return text
    shown = _ascii_kept.get(text)
    if shown is None:
        shown = _as_ascii(text)
        if len(_ascii_kept) >= MAX_KEPT_ASCII:
            _ascii_kept.clear()
        _ascii_kept[text] = shown
    return shown


def _raw(value: Any) -> str:
    return value if type(value) is str else _text(value)


def _nearest_dict(scopes: Scopes) -> dict[str, Any]:
    for i in range(len(scopes) - 1, -1, -1):
        scope = scopes[i]
        if type(scope) is dict:
            return scope
    return {}


def _as_items(value: Any) -> list[Any] | tuple[Any, ...]:
    return value if isinstance(value, (list, tuple)) else (value,)


def _codegen(tokens: list[Token], ascii: bool = False) -> str:
    """Python source of `render(ctx)` for a token list: one straight-line function, loops for sections.
    `ascii`: the text and every escaped value written in ASCII (see Template)."""
    # `top` is the innermost scope: most names resolve there, without a function call.
    lines = [
        "def render(ctx):",
        " out = []",
        " a = out.append",
        " S = [ctx]",
        " top = ctx if type(ctx) is dict else {}",
    ]
    depth, counter = 1, [0]
    stack: list[tuple[str, str]] = []
    pending: list[str] = []

    def emit(line: str) -> None:
        lines.append(" " * depth + line)

    def flush() -> None:
        if pending:
            emit(f"a({''.join(pending)!r})")
            pending.clear()

    for kind, value in tokens:
        if kind == "literal":
            if value:
                pending.append(_as_ascii(value) if ascii else value)
            continue
        if kind in ("comment", "set delimiter"):  # the tokenizer has applied a delimiter change
            continue
        flush()
        if kind in ("variable", "no escape"):
            fn = ("_escaped_ascii" if ascii else "_escaped") if kind == "variable" else "_raw"
            if "." in value:
                emit(f"a({fn}(_value({value!r}, S)))")
            else:
                emit(f"a({fn}(top[{value!r}] if {value!r} in top else _lookup_simple({value!r}, S)))")
        elif kind == "section":
            counter[0] += 1
            n = counter[0]
            if "." in value:
                emit(f"v{n} = _value({value!r}, S)")
            else:
                emit(f"v{n} = top[{value!r}] if {value!r} in top else _lookup_simple({value!r}, S)")
            emit(f"if v{n}:")
            emit(f" for i{n} in _as_items(v{n}):")
            emit(f"  S.append(i{n})")
            # names only resolve in dicts: a section over True/"text" keeps the enclosing dict on top
            emit(f"  if type(i{n}) is dict: top = i{n}")
            depth += 2
            stack.append((value, "section"))
        elif kind == "inverted section":
            counter[0] += 1
            n = counter[0]
            emit(f"if not _value({value!r}, S):")
            emit(" pass")
            depth += 1
            stack.append((value, "inverted"))
        elif kind == "end":
            if not stack or stack[-1][0] != value:
                raise MustacheError(f"unexpected {{{{/{value}}}}}")
            _, how = stack.pop()
            if how == "section":
                emit("S.pop()")
                emit("top = _nearest_dict(S)")
                depth -= 2
            else:
                depth -= 1
        else:
            raise MustacheError(f"mustache {kind} tags are not supported")
    flush()
    if stack:
        raise MustacheError(f"section {{{{#{stack[-1][0]}}}}} is never closed")
    lines.append(" return ''.join(out)")
    return "\n".join(lines) + "\n"


class Template:
    """A token list compiled once; `render(context)` is the text for one context (thread-safe).

    `ascii=True` writes the template's text and every escaped value in ASCII, other characters as
    numeric character references: for an HTML part that goes as 7bit, in place of converting each
    rendered document (mail.ascii_html). The caller makes sure that is the same document
    (mail.renders_as_ascii: no {{{raw}}} tag, none inside <style> or <script>)."""

    def __init__(self, tokens: Iterable[Token], ascii: bool = False) -> None:
        self.ascii = ascii
        self.source = _codegen(list(tokens), ascii)
        namespace: dict[str, Any] = {
            "_value": _value,
            "_lookup_simple": _lookup_simple,
            "_escaped": _escaped,
            "_escaped_ascii": _escaped_ascii,
            "_raw": _raw,
            "_as_items": _as_items,
            "_nearest_dict": _nearest_dict,
        }
        # The source is generated from tag names and repr()'d literals only: names are passed as
        # repr() strings too, so no template text becomes code.
        exec(compile(self.source, "<mustache template>", "exec"), namespace)
        self.render: Callable[[dict[str, Any]], str] = namespace["render"]
