"""tracking/hrefs.py finds the real href attributes of <a> and <area>, as an HTML parser reads them:
html.parser is the judge, over documents generated from the pieces mail HTML is made of — tags with
attributes quoted every way, values that hold `href=`, `>` and entities, comments, <pre> text,
style and script content."""

from __future__ import annotations

import html as html_lib
from html.parser import HTMLParser

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tracking import hrefs

pytestmark = pytest.mark.pure


class Events(HTMLParser):
    """Everything html.parser reports, and each <a>/<area>'s first href (its value, or None)."""

    def __init__(self, document: str):
        super().__init__(convert_charrefs=True)
        self.events: list[tuple] = []
        self.links: list[str | None] = []
        self.feed(document)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.events.append(("start", tag, attrs))
        if tag in ("a", "area"):
            first = next((value for name, value in attrs if name == "href"), "absent")
            if first != "absent":
                self.links.append(first)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        self.events.append(("end", tag))

    def handle_data(self, data):
        self.events.append(("data", data))

    def handle_comment(self, data):
        self.events.append(("comment", data))


def linked(document: str) -> list[str]:
    return [value.strip() for value in Events(document).links if value is not None]


URLS = st.sampled_from(
    ["https://real.example/", "http://x.test/a?b=1&amp;c=2", " https://pad.example/ ", "mailto:a@x.test", "#top", ""]
)
TRICKY = st.sampled_from(
    ['see href="https://fake.example/"', "a > b", "href=https://no.example/", "x &amp; y", "it's", "", "data"]
)
NAMES = st.sampled_from(["href", "HREF", "title", "data-href", "xhref", "class", "alt", "target", "hreflang"])


@st.composite
def attribute(draw) -> str:
    name = draw(NAMES)
    value = draw(URLS if name.lower() == "href" else TRICKY)
    quoting = draw(st.sampled_from(['"', "'", "", "none"]))
    if quoting == "none":
        return name  # no value at all
    if quoting == "":
        bare = value.strip()
        if not bare or any(c in bare for c in " \"'=<>`"):
            quoting = '"'
        else:
            return f"{name}={bare}"
    if quoting in value:
        quoting = '"' if quoting == "'" else "'"
        if quoting in value:
            value = value.replace(quoting, "")
    space = draw(st.sampled_from(["", " "]))
    return f"{name}{space}={space}{quoting}{value}{quoting}"


@st.composite
def element(draw) -> str:
    tag = draw(st.sampled_from(["a", "A", "area", "img", "div", "abbr", "link"]))
    attrs = draw(st.lists(attribute(), max_size=4))
    separator = draw(st.sampled_from([" ", "\n", " / "]))
    inner = draw(st.sampled_from(["", "text", 'href="https://in.text.example/"']))
    opening = f"<{tag}{''.join(separator + a for a in attrs)}>"
    return opening + html_lib.escape(inner, quote=False) + f"</{tag}>"


PIECES = st.one_of(
    element(),
    st.sampled_from(
        [
            "plain text ",
            "<p>a paragraph</p>",
            '<pre>&lt;a href="https://pre.example/"&gt; href="https://pre.example/"</pre>',
            '<!-- <a href="https://comment.example/">old</a> -->',
            '<style>a[href="https://style.example/"] { color: red }</style>',
            "<script>var s = '<a href=\"https://script.example/\">';</script>",
            "&lt;a href=&quot;https://escaped.example/&quot;&gt;",
        ]
    ),
)
DOCUMENTS = st.lists(PIECES, max_size=12).map("".join)


@given(DOCUMENTS)
@hypothesis_settings(max_examples=400, deadline=None)
def test_the_hrefs_found_are_the_ones_an_html_parser_reads(document):
    assert [h.url for h in hrefs.find(document)] == linked(document)


@given(DOCUMENTS)
@hypothesis_settings(max_examples=300, deadline=None)
def test_replacing_them_changes_those_values_and_nothing_else(document):
    found = hrefs.find(document)
    rewritten = hrefs.replace(document, [(h, f"https://t.test/c/{i}") for i, h in enumerate(found)])
    before, after = Events(document), Events(rewritten)
    replaced = iter(range(len(found)))
    expected = []
    for event in before.events:
        if event[0] == "start" and event[1] in ("a", "area"):
            attrs = list(event[2])
            first = next((i for i, (name, _) in enumerate(attrs) if name == "href"), None)
            if first is not None and attrs[first][1] is not None:
                attrs[first] = ("href", f"https://t.test/c/{next(replaced)}")
            event = ("start", event[1], attrs)
        expected.append(event)
    assert after.events == expected


@pytest.mark.parametrize(
    "document, urls",
    [
        ('<a title="see href=https://fake.example/" href="https://real.example/">x</a>', ["https://real.example/"]),
        ('<a data-href="https://data.example/" href="https://real.example/">x</a>', ["https://real.example/"]),
        ('<a data-href="https://data.example/">x</a>', []),
        ('<a title="a > b" href="https://real.example/">x</a>', ["https://real.example/"]),
        ("<a HREF='https://upper.example/' href=\"https://second.example/\">x</a>", ["https://upper.example/"]),
        ('<!-- <a href="https://comment.example/"> -->', []),
        ('<pre>href="https://pre.example/"</pre>', []),
        ('<abbr href="https://abbr.example/">x</abbr><area href=https://area.example/ >', ["https://area.example/"]),
        ('<a href="  https://x.example/?a=1&amp;b=2  ">x</a>', ["https://x.example/?a=1&b=2"]),
    ],
)
def test_real_hrefs_only(document, urls):
    assert [h.url for h in hrefs.find(document)] == urls == linked(document)
