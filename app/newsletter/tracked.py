"""A newsletter's tracked links planned once per template, not found again in every recipient's HTML.

tracking/links.py rewrites each rendered document: it tokenizes the HTML for <a>/<area> hrefs, signs
a click code per link and adds the open pixel before the last </body>. A newsletter's links are the
same for every recipient: they are in the template's text, and the values a recipient brings (their
name, address, links) are HTML-escaped and cannot open or close a tag. So when the template's own
structure says so, the links are found once, in the template, and each trackable href becomes a
slot the recipient's click URL fills, the pixel another; per recipient only the codes are signed.

The plan is made only when every value lies outside any markup, whatever the recipient: no
{{{raw}}} tag; every tag and section boundary outside anything that starts with "<" (a tag, a
comment, a stray "<": scanned up to its ">" with quoted values); no section boundary inside a
comment or <script>/<style> content; no </body> inside a section and no <img> only inside one
(the pixel's place and form are then the same for everyone). Otherwise — and for a reader who opted
out, or with TRACKING off — the document is rewritten as rendered, by tracking/links.py.
tests/newsletter/test_tracked.py holds a plan's output to tracking/links.py's for generated
templates and recipients.
"""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass

from app.platform import mustache
from tracking import hrefs, links

# Context names of the slots (never a template variable: the API accepts only template.VARIABLES).
CLICK = "notify_tracked_click_"
PIXEL = "notify_tracked_pixel"
_MARK = "\x00"  # where a value or a section boundary goes, in the template's skeleton
# Anything from "<" to its ">" (quoted values may hold ">"), or to the end when it never closes.
_MARKUP = re.compile(r"""<(?:"[^"]*"|'[^']*'|[^'">])*>?""")
# What hides markup from hrefs.find (hrefs._HIDDEN): comments and <script>/<style> content.
_HIDDEN = re.compile(
    r"""<(?:!--.*?(?:-->|\Z)|(script|style)(?=[\s/>])(?:"[^"]*"|'[^']*'|[^'">])*>.*?(?:</\1\s*>|\Z))""",
    re.IGNORECASE | re.DOTALL,
)
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)
_BODY_END_START = re.compile(r"</body", re.IGNORECASE)
_IMG = re.compile(r"<img\b", re.IGNORECASE)


@dataclass(frozen=True)
class Plan:
    """One template's tracked form: `template` renders the tracked document from a recipient's
    context plus values(); `urls`: the click slots' URLs, in slot order."""

    template: mustache.Template
    urls: tuple[str, ...]
    with_img: bool  # the document has an <img>: the pixel is an <img> too (links.pixel_html)
    # context names whose value is a whole href (href="{{unsubscribe_url}}"): such a recipient's
    # value that is a trackable URL sends them the document rewritten as rendered
    dynamic: tuple[str, ...] = ()
    ascii: bool = False

    def applies(self, context: dict, rewriter: links.LinkRewriter) -> bool:
        """Whether this recipient's document is the plan's: none of their dynamic hrefs is tracked."""
        for key in self.dynamic:
            value = context.get(key, "")
            if type(value) is not str:
                return False
            if self.ascii and not value.isascii():
                value = html_lib.unescape(_as_ascii(html_lib.escape(value)))
            if rewriter.trackable(value.strip()):
                return False
        return True


def _merged(tokens: list) -> list:
    """The tokens with comments and delimiter changes gone and adjacent literals joined (a tag may
    be cut by a {{! comment}} in the source)."""
    out: list = []
    for kind, value in tokens:
        if kind in ("comment", "set delimiter"):
            continue
        if kind == "literal" and out and out[-1][0] == "literal":
            out[-1] = ("literal", out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def _as_ascii(text: str) -> str:
    """What mustache.Template(ascii=True) writes for a literal (numeric references)."""
    return text.encode("ascii", "xmlcharrefreplace").decode("ascii")


def plan(tokens: list, rewriter: links.LinkRewriter, ascii: bool) -> Plan | None:
    """The plan of an HTML template (its tokens as compiled), or None when its links may depend on
    the recipient. `ascii`: the template renders in ASCII (mustache.Template ascii): its literals
    are then read as written that way, as tracking/links.py reads the rendered document."""
    tokens = _merged(tokens)
    kinds = {"literal", "variable", "section", "inverted section", "end"}
    if any(kind not in kinds for kind, _ in tokens):
        return None  # {{{raw}}}: a value could bring markup
    if ascii:
        tokens = [(kind, _as_ascii(value)) if kind == "literal" else (kind, value) for kind, value in tokens]
    if any(_MARK in value for kind, value in tokens if kind == "literal"):
        return None  # the template's own text holds the mark character
    # The skeleton: the literals, a mark for everything else; where each token starts in it.
    starts, parts, at = [], [], 0
    for kind, value in tokens:
        starts.append(at)
        piece = value if kind == "literal" else _MARK
        parts.append(piece)
        at += len(piece)
    skeleton = "".join(parts)
    boundaries = [starts[i] for i, (kind, _) in enumerate(tokens) if kind in ("section", "inverted section", "end")]
    for markup in _MARKUP.finditer(skeleton):
        if _MARK in markup.group(0) and not _values_quoted(markup, set(boundaries)):
            return None  # a value or a section boundary where it could change the markup
    for hidden in _HIDDEN.finditer(skeleton):
        if any(hidden.start() <= b < hidden.end() for b in boundaries):
            return None  # whether markup is hidden would depend on a section
    # The trackable hrefs, each inside one literal (no mark is inside a tag): cut into slots.
    cuts: dict[int, list[tuple[int, int, str]]] = {}
    dynamic: list[str] = []
    i = 0
    for h in hrefs.find(skeleton):
        while i + 1 < len(tokens) and starts[i + 1] <= h.start:
            i += 1
        if _MARK in h.url:
            # href="{{unsubscribe_url}}": its URL is the recipient's value, checked per recipient
            whole = skeleton[h.start : h.end]
            if whole != f'"{_MARK}"' or i + 1 >= len(tokens) or tokens[i + 1][0] != "variable":
                return None
            key = tokens[i + 1][1]
            if "." in key:
                return None
            dynamic.append(key)
            continue
        if not rewriter.trackable(h.url):
            continue
        if tokens[i][0] != "literal" or h.end > starts[i] + len(tokens[i][1]):
            return None
        cuts.setdefault(i, []).append((h.start - starts[i], h.end - starts[i], h.url))
    urls: list[str] = []
    slot: dict[str, int] = {}
    out: list = []
    for i, (kind, value) in enumerate(tokens):
        if kind != "literal" or i not in cuts:
            out.append((kind, value))
            continue
        pos = 0
        for start, end, url in cuts[i]:
            if url not in slot:
                slot[url] = len(urls)
                urls.append(url)
            out += [("literal", value[pos:start] + '"'), ("no escape", f"{CLICK}{slot[url]}"), ("literal", '"')]
            pos = end
        out.append(("literal", value[pos:]))
    # The pixel: an <img> when the document has one (never only inside a section), before the last
    # </body> (never inside a section), else at the end.
    depth = 0
    top: list[int] = []
    inner: list[int] = []
    for i, (kind, _) in enumerate(out):
        if kind in ("section", "inverted section"):
            depth += 1
        elif kind == "end":
            depth -= 1
        elif kind == "literal":
            (inner if depth else top).append(i)
    if any(_BODY_END_START.search(out[i][1]) for i in inner):
        return None
    with_img = any(_IMG.search(out[i][1]) for i in top)
    if not with_img and any(_IMG.search(out[i][1]) for i in inner):
        return None
    ends = [i for i in top if _BODY_END.search(out[i][1])]
    if ends:
        value = out[ends[-1]][1]
        cut = list(_BODY_END.finditer(value))[-1].start()
        out[ends[-1] : ends[-1] + 1] = [("literal", value[:cut]), ("no escape", PIXEL), ("literal", value[cut:])]
    else:
        out.append(("no escape", PIXEL))
    return Plan(mustache.Template(out, ascii=ascii), tuple(urls), with_img, tuple(dict.fromkeys(dynamic)), ascii)


def _values_quoted(markup: re.Match[str], boundaries: set[int]) -> bool:
    """Whether every mark in this markup (a tag) is a value inside a double-quoted attribute value:
    an escaped value holds no '"', so the tag reads the same whatever it is."""
    text, base = markup.group(0), markup.start()
    if text.startswith("<!"):
        return False  # a comment (or a doctype): a value there could end it
    for part in _TAG_PARTS.finditer(text):
        inside = part.group(0).startswith('"') and part.group(0).endswith('"') and len(part.group(0)) > 1
        for k, char in enumerate(part.group(0)):
            if char == _MARK and (not inside or base + part.start() + k in boundaries):
                return False
    return True


_TAG_PARTS = re.compile(r""""[^"]*"|'[^']*'|[^'"]+|['"]""")


class Tracker:
    """A plan's per-recipient values: the click URL of each slot and the pixel, for one newsletter
    (its link rows created once, at the first recipient)."""

    def __init__(self, rewriter: links.LinkRewriter, mail_kind: str, mail_id: int):
        self.rewriter, self.mail_kind, self.mail_id = rewriter, mail_kind, mail_id
        self._ids: dict[tuple[str, ...], tuple[int, ...]] = {}

    def values(self, p: Plan, subscriber_id: int | None) -> dict[str, str]:
        ids = self._ids.get(p.urls)
        if ids is None:
            known = links.ensure_links(self.mail_kind, self.mail_id, list(p.urls)) if p.urls else {}
            ids = self._ids[p.urls] = tuple(known[url] for url in p.urls)
        out = {f"{CLICK}{k}": links.click_url(link_id, subscriber_id) for k, link_id in enumerate(ids)}
        pixel = links.pixel_url(self.mail_kind, self.mail_id, subscriber_id)
        out[PIXEL] = links.pixel_html(pixel, "<img" if p.with_img else "")
        return out
