"""The real `href` attributes of <a> and <area> in an HTML document, found by tokenizing it as an
HTML parser does: never text (a `<pre>` full of `href="…"`, an escaped `&lt;a href…`), comments,
script or style content, another attribute that merely contains `href=` in its value (`title="see
href=…"`), or one whose name only ends in it (`data-href`).

A start tag is read attribute by attribute: a name, then optionally `=` and a double-quoted,
single-quoted or bare value (a quoted value may hold `>`). The first attribute named `href` (any
case) is the link, as browsers take it. Regular expressions walk the document (link rewriting runs
on every tracked mail, and html.parser costs many times more), and tests/tracking/test_hrefs.py
holds them to html.parser's reading of generated documents.
"""

from __future__ import annotations

import html as html_lib
import re
from typing import NamedTuple

# What hides markup from the tokenizer: a comment (unclosed: to the end) and the raw text of script and
# style (html.parser's CDATA content elements). Looked for only in documents that have any.
_HIDDEN = re.compile(
    r"""<(?:!--.*?(?:-->|\Z)|(?P<raw>script|style)(?=[\s/>])(?:"[^"]*"|'[^']*'|[^'">])*>.*?(?:</(?P=raw)\s*>|\Z))""",
    re.IGNORECASE | re.DOTALL,
)
_MAY_HIDE = re.compile(r"<(?:!--|[sS][cC][rR][iI][pP][tT]|[sS][tT][yY][lL][eE])")  # IGNORECASE is slower
# A start tag that carries links: its attributes, a quoted value may hold `>`.
_LINK_TAG = re.compile(r"""<(?:a|area)(?=[\s/>])((?:"[^"]*"|'[^']*'|[^'">])*)>""", re.IGNORECASE)
# One attribute of a start tag: a name, then optionally `=` and a value.
_ATTRIBUTE = re.compile(r"""[\s/]*([^\s/>"'=][^\s/>"'=]*)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s"'>]*))?""")


class Href(NamedTuple):
    start: int  # the value's place in the document, its quotes included
    end: int
    url: str  # as a browser reads it: entities decoded, surrounding white space gone


def find(document: str) -> list[Href]:
    """Each <a>/<area> start tag's first href with a value, in document order."""
    hidden = [m.span() for m in _HIDDEN.finditer(document)] if _MAY_HIDE.search(document) else []
    found, pos, skip = [], 0, 0
    while (tag := _LINK_TAG.search(document, pos)) is not None:
        while skip < len(hidden) and hidden[skip][1] <= tag.start():
            skip += 1
        if skip < len(hidden) and hidden[skip][0] <= tag.start():
            pos = hidden[skip][1]  # a tag inside a comment or script is text: go on after it
            continue
        pos = tag.end()
        href = _first_href(tag)
        if href is not None:
            found.append(href)
    return found


# The usual tag, `<a href="…"` with no entity in the value: its first attribute, read at once.
_LEADING_HREF = re.compile(r"""\s+href\s*=\s*("[^"&]*")""")


def _first_href(tag: re.Match[str]) -> Href | None:
    attrs = tag.group(1)
    offset = tag.start(1)
    leading = _LEADING_HREF.match(attrs)
    if leading is not None:
        start, end = leading.span(1)
        return Href(offset + start, offset + end, attrs[start + 1 : end - 1].strip())
    if "href" not in attrs and "href" not in attrs.lower():
        return None
    pos = 0
    while (attribute := _ATTRIBUTE.match(attrs, pos)) is not None:
        pos = attribute.end()
        if attribute.group(1).lower() == "href":
            value = attribute.group(2)
            if value is None:
                return None
            start, end = attribute.span(2)
            raw = value[1:-1] if value[:1] in ("'", '"') else value
            return Href(offset + start, offset + end, html_lib.unescape(raw).strip())
    return None


def replace(document: str, new_values: list[tuple[Href, str]]) -> str:
    """The document with these hrefs' values (in document order) replaced, each double-quoted; the
    values must need no escaping inside double quotes."""
    out, pos = [], 0
    for href, value in new_values:
        out.append(document[pos : href.start])
        out.append(f'"{value}"')
        pos = href.end
    out.append(document[pos:])
    return "".join(out)
