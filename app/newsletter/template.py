"""Newsletter templates: validated on create, compiled ONCE per newsletter, rendered per recipient.

Compilation = premailer (CSS inlined once, before Mustache: it is far too slow per mail;
app/platform/css_inline.py) + Mustache compiled once (app/platform/mustache.py, the implementation
digests use too). Templates see only the recipient variables below; partials are refused (no file
system access from user input).

Compliance by construction, decided once per newsletter (and variant) from the tokens (never per
recipient): a part (HTML, text, independently) whose template has no `unsubscribe_url` tag that
always renders (any of {{x}}, {{{x}}}, {{&x}} outside every {{#section}}/{{^section}} and, in HTML,
outside <!-- comments -->) gets the standard footer: why the reader gets it, unsubscribe link,
preferences link and MAIL_POSTAL_ADDRESS, its words in the reader's language (`footer_words`, the
context's `locale`). A part that has the link but not the address (as literal text) gets the
address alone. The HTML footer goes before the last top-level </body>, else at the end.

Layout: an HTML body that is a fragment (no <html>, <body> or doctype) is wrapped in the mail
layout (app/platform/mail_layout.py: brand header, card, colours from settings) before premailer; a full document
is sent as written. The derived text part comes from the body as written, without the layout.

`{{greeting}}` is the one greeting of every mail, digests' included (app/platform/greeting.py):
"Hi Ana," or, without a name, "Hi,". `{{name}}` of a subscriber without a name shows NAME_FALLBACK
(empty unless set: "News for {{name}}" would read "News for there"; write
`{{#name}}for {{name}}{{/name}}`): the variable tags are pointed at a `display_name` value at
compile time, while `{{#name}}` / `{{^name}}` sections still test the real name.
"""

from __future__ import annotations

import html as html_lib
import logging
import re
import threading
from dataclasses import dataclass

from app.platform import config, greeting, i18n, mail, mail_layout, mustache
from app.platform.css_inline import inline_css as _inline_css

log = logging.getLogger("app.newsletter.template")

VARIABLES = ("name", "greeting", "email", "user_id", "unsubscribe_url", "preferences_url")
MAX_SUBJECT = 500
MAX_HTML = 512 * 1024
MAX_TEXT = 256 * 1024
MAX_FROM = 320


def tokenize(source: str) -> list:
    return list(mustache.tokenize(source))


def check(field: str, source: str) -> list[dict]:
    """Problems with one template as {field, message}: syntax, partials, unknown variables."""
    try:
        tokens = tokenize(source)
    except mustache.MustacheError as exc:
        return [{"field": field, "message": f"is not a valid Mustache template: {exc}"}]
    errors = []
    for kind, key in tokens:
        if kind == "partial":
            errors.append({"field": field, "message": f"partials are not supported ({{{{> {key}}}}})"})
        elif kind in ("variable", "no escape", "section", "inverted section") and key != "." and key not in VARIABLES:
            errors.append({"field": field, "message": f"unknown variable {key!r}; available: {', '.join(VARIABLES)}"})
    return errors


def inline_css(source: str) -> str:
    """premailer once per template; Mustache tags survive it when written without inner spaces."""
    if "<style" not in source.lower():
        return source  # nothing to inline; premailer would only reformat the document
    try:
        return _inline_css(source, strip_important=True)
    except Exception as exc:  # a stylesheet premailer cannot parse must not block the send
        log.warning("premailer failed (%s); sending the HTML with its <style> block as written", exc)
        return source


_BLOCK_END = re.compile(r"(?i)<\s*(br\s*/?|/p|/div|/h[1-6]|/li|/tr|/table)\s*>")
_LINK = re.compile(r'(?is)<a\s[^>]*href="([^"]*)"[^>]*>(.*?)</a>')
_DROP = re.compile(r"(?is)<(style|script|head)[^>]*>.*?</\1\s*>")
_TAG = re.compile(r"(?s)<[^>]+>")


def text_from_html(source: str) -> str:
    """A plain-text alternative derived from the HTML template source (Mustache tags kept)."""
    text = _DROP.sub("", source)
    text = _LINK.sub(lambda m: f" {_TAG.sub('', m.group(2)).strip()} ({m.group(1)}) ", text)
    text = _BLOCK_END.sub("\n", text)
    text = html_lib.unescape(_TAG.sub("", text))
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _unescaped(tokens: list) -> list:
    """Text/subject parts are not HTML: render variables without HTML escaping."""
    return [("no escape", key) if kind == "variable" else (kind, key) for kind, key in tokens]


@dataclass(frozen=True)
class Rendered:
    subject: str
    html: str
    text: str


def always_renders(tokens: list, name: str, html: bool) -> bool:
    """Whether a {{name}} tag (escaped or not) renders for every recipient: outside every section
    (a section's condition may be false for someone) and, in HTML, outside <!-- comments -->."""
    depth, in_comment = 0, False
    for kind, key in tokens:
        if kind == "literal":
            pos = 0
            while html:
                marker = "-->" if in_comment else "<!--"
                found = key.find(marker, pos)
                if found < 0:
                    break
                in_comment, pos = not in_comment, found + len(marker)
        elif kind in ("section", "inverted section"):
            depth += 1
        elif kind == "end":
            depth -= 1
        elif kind in ("variable", "no escape") and key == name and depth == 0 and not in_comment:
            return True
    return False


def _shows(tokens: list, address: str, html: bool) -> bool:
    """Whether the template's own text already carries the postal address."""
    literal = "".join(key for kind, key in tokens if kind == "literal")
    return address in literal or (html and html_lib.escape(address, quote=False) in literal)


_FOOTER_STYLE = "font-size:12px;color:#7b8794;text-align:center;padding:16px 8px;line-height:18px"
_FOOTER_LINK_STYLE = "color:#7b8794"


# The footer's words are the reader's (the variant's language, app/newsletter/variants.py): the
# tokens name these context values, which render() fills from the reader's translator.
FOOTER_REASON = "notify_footer_reason"
FOOTER_UNSUBSCRIBE = "notify_footer_unsubscribe"
FOOTER_PREFERENCES = "notify_footer_preferences"
FOOTER_UNSUBSCRIBE_LINE = "notify_footer_unsubscribe_line"
FOOTER_PREFERENCES_LINE = "notify_footer_preferences_line"


def footer_words(t: i18n.Translator, unsubscribe_url: str, preferences_url: str) -> dict[str, str]:
    """The footer's words in the reader's language (the values its tokens name)."""
    return {**footer_constant_words(t), **footer_lines(t, unsubscribe_url, preferences_url)}


def footer_constant_words(t: i18n.Translator) -> dict[str, str]:
    """The footer's words that are the same for every reader of a language."""
    return {
        FOOTER_REASON: t.gettext("You get this newsletter because you have an account with newsletters turned on."),
        FOOTER_UNSUBSCRIBE: t.gettext("Unsubscribe"),
        FOOTER_PREFERENCES: t.gettext("Email preferences"),
    }


def footer_lines(t: i18n.Translator, unsubscribe_url: str, preferences_url: str) -> dict[str, str]:
    """The text footer's lines with the reader's own links."""
    return {
        FOOTER_UNSUBSCRIBE_LINE: t.gettext("Unsubscribe: {url}", url=unsubscribe_url),
        FOOTER_PREFERENCES_LINE: t.gettext("Email preferences: {url}", url=preferences_url),
    }


def html_footer(address: str, links: bool) -> list:
    """Footer tokens for the HTML part (the address is literal text, escaped here once)."""
    tokens = [("literal", f'\n<div class="notify-footer" style="{_FOOTER_STYLE}">\n')]
    if links:
        tokens += [
            ("variable", FOOTER_REASON),
            ("literal", '<br>\n<a href="'),
            ("variable", "unsubscribe_url"),
            ("literal", f'" style="{_FOOTER_LINK_STYLE}">'),
            ("variable", FOOTER_UNSUBSCRIBE),
            ("literal", '</a> &middot; <a href="'),
            ("variable", "preferences_url"),
            ("literal", f'" style="{_FOOTER_LINK_STYLE}">'),
            ("variable", FOOTER_PREFERENCES),
            ("literal", "</a>" + ("<br>\n" if address else "\n")),
        ]
    if address:
        tokens.append(("literal", html_lib.escape(address, quote=False) + "\n"))
    tokens.append(("literal", "</div>\n"))
    return tokens


def text_footer(address: str, links: bool, after_newline: bool = False) -> list:
    tokens = [("literal", ("\n" if after_newline else "\n\n") + "--\n")]
    if links:
        tokens += [
            ("no escape", FOOTER_REASON),
            ("literal", "\n"),
            ("no escape", FOOTER_UNSUBSCRIBE_LINE),
            ("literal", "\n"),
            ("no escape", FOOTER_PREFERENCES_LINE),
            ("literal", "\n"),
        ]
    if address:
        tokens.append(("literal", address + "\n"))
    return tokens


def _before_body_end(tokens: list, footer: list) -> list:
    """Footer inserted before the last top-level </body> (case-insensitive), else appended."""
    depth, at = 0, None
    for i, (kind, key) in enumerate(tokens):
        if kind in ("section", "inverted section"):
            depth += 1
        elif kind == "end":
            depth -= 1
        elif kind == "literal" and depth == 0 and "</body" in key.lower():
            at = i
    if at is None:
        return [*tokens, *footer]
    key = tokens[at][1]
    cut = key.lower().rfind("</body")
    return [*tokens[:at], ("literal", key[:cut]), *footer, ("literal", key[cut:]), *tokens[at + 1 :]]


def with_footer(tokens: list, address: str, html: bool) -> list:
    """The part's tokens with whatever of the standard footer it lacks (see the module docstring)."""
    links = not always_renders(tokens, "unsubscribe_url", html)
    address = address if address and not _shows(tokens, address, html) else ""
    if not links and not address:
        return tokens
    if html:
        return _before_body_end(tokens, html_footer(address, links))
    after_newline = bool(tokens) and tokens[-1][0] == "literal" and tokens[-1][1].endswith("\n")
    return [*tokens, *text_footer(address, links, after_newline)]


DISPLAY_NAME = "display_name"


def _name_fallback(tokens: list) -> list:
    """{{name}} / {{{name}}} read `display_name` (the name, or NAME_FALLBACK); sections keep `name`."""
    return [
        (kind, DISPLAY_NAME) if kind in ("variable", "no escape") and key == "name" else (kind, key)
        for kind, key in tokens
    ]


class Compiled:
    """One newsletter's templates, ready to render many recipients (thread-safe, read-only).
    `postal_address`, `name_fallback`: from settings by default. `brand`: the layout a fragment
    body is wrapped in (compiled_for, i.e. every send, passes the configured one); None: no layout."""

    def __init__(
        self,
        subject: str,
        html: str,
        text: str | None,
        postal_address: str | None = None,
        brand: mail_layout.Brand | None = None,
        name_fallback: str | None = None,
    ):
        settings = config.get()
        if postal_address is None:
            postal_address = settings.mail_postal_address
        self.name_fallback = settings.name_fallback if name_fallback is None else name_fallback
        self.wrapped = brand is not None and mail_layout.is_fragment(html)
        body = mail_layout.wrap(html, brand) if self.wrapped else html
        self.subject_tokens = _name_fallback(_unescaped(tokenize(subject)))
        self.html_tokens = _name_fallback(with_footer(tokenize(inline_css(body)), postal_address, html=True))
        self.text_tokens = _name_fallback(
            with_footer(_unescaped(tokenize(text if text else text_from_html(html))), postal_address, html=False)
        )
        self._locale_words: dict[tuple, tuple[i18n.Translator, dict[str, str]]] = {}
        self._subject = mustache.Template(self.subject_tokens)
        self._html = mustache.Template(self.html_tokens)
        # What the send loop mails: written in ASCII as it renders (numeric references for other
        # characters) when that is the same document (mail.renders_as_ascii), so the part goes 7bit
        # instead of quoted-printable; render(context, mail_html) renders it.
        self.html_ascii = mail.renders_as_ascii(self.html_tokens)
        self.mail_html = mustache.Template(self.html_tokens, ascii=True) if self.html_ascii else self._html
        self._text = mustache.Template(self.text_tokens)

    def render(self, context: dict, html: mustache.Template | None = None, extra: dict | None = None) -> Rendered:
        """`context`: the recipient's variables and `locale`, the language of the words the service
        adds (greeting, footer) and of the mail's lang/dir (None: DEFAULT_LOCALE). `html`: another
        form of the HTML template (app/newsletter/tracked.py's, with link slots), `extra` its values."""
        context = self.full_context(context)
        return Rendered(
            # One line whatever the variables hold (a user_id may hold a control character).
            subject=mail.one_line(self._subject.render(context)),
            html=self._html.render(context) if html is None else html.render({**context, **(extra or {})}),
            text=self._text.render(context),
        )

    def full_context(self, context: dict) -> dict:
        """The recipient's variables with the words and values the service adds (render() uses it)."""
        if DISPLAY_NAME not in context:
            name = context.get("name")
            t, words = self._words(context.get("locale"))
            context = {
                **context,
                DISPLAY_NAME: name or self.name_fallback,
                "greeting": greeting.greeting(name, self.name_fallback, t),
                **words,
                **footer_lines(t, context.get("unsubscribe_url", ""), context.get("preferences_url", "")),
            }
        return context

    def _words(self, locale: str | None) -> tuple[i18n.Translator, dict[str, str]]:
        """A locale's translator and the words every reader in it gets alike (lang, dir, the
        footer's), looked up once per locale and DEFAULT_LOCALE."""
        key = (locale, config.get().default_locale)
        found = self._locale_words.get(key)
        if found is None:
            t = i18n.translator(locale)
            found = (t, {"lang": t.language, "dir": t.direction, **footer_constant_words(t)})
            if len(self._locale_words) < 256:
                self._locale_words[key] = found
        return found


_cache: dict[tuple, Compiled] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 32


def compiled_for(newsletter_id: int, subject: str, html: str, text: str | None, variant: str | None = None) -> Compiled:
    """Per-process cache, keyed by id, variant (its locale tag; None: the default) AND content (a
    content hash costs microseconds; premailer costs milliseconds to seconds), so a reused id (a
    restored or test database) never renders another newsletter's template, nor one variant another's."""
    settings = config.get()
    postal_address, brand = settings.mail_postal_address, mail_layout.Brand.from_settings(settings)
    key = (newsletter_id, variant, hash((subject, html, text, postal_address, brand, settings.name_fallback)))
    found = _cache.get(key)
    if found is not None:
        return found
    compiled = Compiled(subject, html, text, postal_address, brand, settings.name_fallback)
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))
        _cache[key] = compiled
    return compiled


# --- The template grammar the API accepts, as one regular expression ------------------------------
# Written in the common subset of ECMA-262 (the OpenAPI `pattern` dialect) and Python `re`: explicit
# character classes only (no \s, \w, \d), so the documented pattern and the server agree exactly.
# It admits text, {{var}}, {{&var}}, {{{var}}}, {{! comments }} and {{#var}}/{{^var}} sections
# (nested at most SECTION_DEPTH deep, {{.}} inside them); no partials, no set-delimiter tags, no
# unknown variables, at least one non-whitespace character, and never U+0000 (Postgres text cannot
# hold it). A "{" in text must not start "{{".
SECTION_DEPTH = 2
# Every character str.isspace() accepts: "blank" means exactly what str.strip() removes.
_WHITESPACE = (
    0x09,
    0x0A,
    0x0B,
    0x0C,
    0x0D,
    0x1C,
    0x1D,
    0x1E,
    0x1F,
    0x20,
    0x85,
    0xA0,
    0x1680,
    *range(0x2000, 0x200B),
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
)


def _u(codepoint: int) -> str:
    return f"\\u{codepoint:04x}"


def _ranges(codepoints) -> str:
    points, out, i = sorted(set(codepoints)), [], 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        out.append(_u(points[i]) if i == j else f"{_u(points[i])}-{_u(points[j])}")
        i = j + 1
    return "".join(out)


def template_pattern(forbidden: str = "") -> str:
    """The anchored pattern for one template field; `forbidden`: characters the field never holds
    besides U+0000 (the subject: CR and LF)."""
    bad = {0, *map(ord, forbidden)}
    bad_class = _ranges(bad)
    char = f"[^\\{{{bad_class}]"  # a text character other than "{"
    text = f"(?:{char}|\\{{{char})"  # ... or a "{" that does not start "{{"
    blank = f"[{_ranges(set(_WHITESPACE) - bad)}]"
    solid = f"[^\\{{{_ranges(bad | set(_WHITESPACE))}]"
    comment_char = f"[^\\}}{bad_class}]"
    comment = f"\\{{\\{{!(?:{comment_char}|\\}}{comment_char})*\\}}\\}}"
    names = "|".join(VARIABLES)

    def variable(allowed: str) -> str:
        return f"\\{{\\{{&? *(?:{allowed}) *\\}}\\}}|\\{{\\{{\\{{ *(?:{allowed}) *\\}}\\}}\\}}"

    groups = [0]

    def section(depth: int) -> str:
        groups[0] += 1
        n = groups[0]
        inner = body(depth - 1, names + "|\\.")
        return f"\\{{\\{{[#^] *({names}) *\\}}\\}}(?:{inner})*\\{{\\{{/ *\\{n} *\\}}\\}}"

    def body(depth: int, allowed: str) -> str:
        parts = [text, variable(allowed), comment]
        if depth > 0:
            parts.append(section(depth))
        return "|".join(parts)

    def first(depth: int) -> str:
        parts = [solid, f"\\{{{char}", variable(names), comment, section(depth)]
        return "|".join(parts)

    start = first(SECTION_DEPTH)
    rest = body(SECTION_DEPTH, names)
    return f"^{blank}*(?:(?:{start})(?:{rest})*\\{{?|\\{{)$"


# A subject is one header line: no control character and no line break, Unicode's included
# (app/platform/validation.py LINE_BREAK_OR_CONTROL); build() refuses a subject that holds one.
SUBJECT_FORBIDDEN = "".join(map(chr, [*range(1, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]))
SUBJECT_PATTERN = template_pattern(SUBJECT_FORBIDDEN)
BODY_PATTERN = template_pattern()
_GRAMMAR = {
    "subject": re.compile(SUBJECT_PATTERN[1:-1]),
    "html": re.compile(BODY_PATTERN[1:-1]),
    "text": re.compile(BODY_PATTERN[1:-1]),
}


def matches_grammar(field: str, source: str) -> bool:
    return _GRAMMAR[field].fullmatch(source) is not None
