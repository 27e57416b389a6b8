"""Every subscriber's language: locales, message catalogs, plurals, lists, numbers and dates.

Why gettext catalogs (docs/i18n.md says more): `.po` files are what translators and their tools
(Poedit, Weblate, Crowdin) already read; Babel extracts the messages from the code and templates
and reads the catalogs; and CLDR, through Babel, decides every plural and list. Messages are
English source strings with `{name}` placeholders, filled after translation (`str.format`).

Locales are BCP 47 tags (`pt-BR`, `de`, `ar`), parsed and normalised with Babel (`pt_br` and
`pt-br` are `pt-BR`); a tag Babel does not know is refused (`LocaleError`). The catalogs are
`app/locale/<tag>.po`, read once per process, on first use. A message is looked up along a
fallback chain, message by message: the locale (`de-CH`), its language (`de`), a shipped catalog of
another region of that language (`pt-PT` reads `pt-BR`), DEFAULT_LOCALE, and the English source
last, so a reader never sees a raw key. Each fallback from a shipped locale is
counted (`notify_i18n_fallbacks_total{locale}`) and logged once per process and message.

Plurals follow CLDR: a plural message has one form per CLDR category of its locale (ru: one, few,
many, other; ar: zero, one, two, few, many, other; ja: other), in CLDR's order, and Babel picks the
category of a count. The `.po` header's Plural-Forms is derived from the same rule
(scripts/dev/messages.py writes it; tests/checks/test_catalogs.py checks every catalog).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from functools import lru_cache
from pathlib import Path

from babel import Locale, UnknownLocaleError, localedata
from babel.dates import (
    format_date,
    format_datetime,
    format_skeleton,
    format_time,
    format_timedelta,
    match_skeleton,
)
from babel.lists import format_list
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po
from babel.numbers import format_decimal

from app.platform import config, metrics

log = logging.getLogger("app.platform.i18n")

CATALOG_DIR = Path(__file__).resolve().parents[1] / "locale"
SOURCE = "en"  # the language of the messages in the code
# Complete catalogs; the preference page offers these. en-XA is the pseudo-locale (accented, longer,
# bracketed), for finding words that were never translated; it is not offered to subscribers.
SHIPPED = ("en", "pt-BR", "es", "fr", "de", "ru", "ar", "ja")
PSEUDO = "en-XA"
MAX_TAG = 35  # the longest well-formed tag RFC 5646 asks implementations to accept
# Bare English formats dates as CLDR's international English ("3 Mar", "19:00"), as the service
# always wrote them; `en-US` gets "Mar 3".
FORMAT_LOCALES = {"en": "en_001", PSEUDO: "en_001"}
MAX_KEPT_NUMBERS = 10_000  # formatted numbers a translator keeps (digest counts are small and repeat)
MAX_KEPT_MESSAGES = 10_000  # resolved messages (and plural forms by count) a translator keeps
# CLDR's plural categories, in the order catalogs keep their forms.
CATEGORIES = ("zero", "one", "two", "few", "many", "other")


class LocaleError(ValueError):
    pass


_ACCENTS = str.maketrans(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "åƀçðéƒĝĥîĵķļɱñöþǫŕšţûṽŵẋýžÅƁÇÐÉƑĜĤÎĴĶĻṀÑÖÞǪŔŠŢÛṼŴẊÝŽ",
)
_PLACEHOLDER = re.compile(r"(\{[a-z_0-9]+\}|%\([a-z_]+\)s|<[^>]*>|&[a-z]+;)")


def pseudo(text: str) -> str:
    """The pseudo-locale's version of a message (scripts/dev/messages.py writes en-XA.po with it):
    accented, about 35 % longer, bracketed; placeholders, markup and entities untouched."""
    parts = _PLACEHOLDER.split(text)
    shown = "".join(p if _PLACEHOLDER.fullmatch(p) else p.translate(_ACCENTS) for p in parts)
    letters = sum(len(p) for p in parts if not _PLACEHOLDER.fullmatch(p))
    return f"[{shown}{'·' * max(1, round(letters * 0.35))}]"


def bcp47(locale: Locale) -> str:
    """Babel's `pt_BR` as the tag a person writes: `pt-BR` (config.py spells DEFAULT_LOCALE alike)."""
    return "-".join(part for part in (locale.language, locale.script, locale.territory, locale.variant) if part)


@lru_cache(maxsize=512)
def _parse(tag: str) -> Locale:
    if tag.replace("-", "_") == PSEUDO.replace("-", "_"):
        return Locale.parse("en_XA") if _known("en_XA") else Locale("en")
    try:
        return Locale.parse(tag.replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError) as exc:
        raise LocaleError(f"{tag!r} is no locale this service knows: {exc}") from None


def _known(identifier: str) -> bool:
    try:
        Locale.parse(identifier)
    except (UnknownLocaleError, ValueError):
        return False
    return True


def normalize(tag: object) -> str:
    """A BCP 47 tag in its one spelling (`pt_br` -> `pt-BR`); LocaleError for anything else."""
    if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG or not tag.isascii():
        raise LocaleError("a locale is a BCP 47 tag such as `pt-BR`, `de` or `ar`")
    if tag.replace("_", "-").lower() == PSEUDO.lower():
        return PSEUDO
    return bcp47(_parse(tag))


@lru_cache(maxsize=1)
def known() -> tuple[str, ...]:
    """Every tag normalize() accepts in its one spelling: CLDR's locales as Babel ships them, and the
    pseudo-locale (the API documents them as an enum, as it does time zones)."""
    tags = {bcp47(Locale.parse(i)) for i in localedata.locale_identifiers() if i != "root"}
    return tuple(sorted(tags | {PSEUDO}))


def _steps(tag: str) -> tuple[str, ...]:
    """A tag, its language, and a shipped catalog of another region of that language (the first by
    tag; never the pseudo-locale): Portuguese of Brazil reads better to a `pt-PT` reader than
    English does, as newsletter variants already chose (app/newsletter/variants.py)."""
    language = tag.split("-")[0]
    regional = next((t for t in sorted(SHIPPED) if "-" in t and t.split("-")[0] == language), None)
    return (tag, language, regional) if regional else (tag, language)


def chain(tag: str) -> tuple[str, ...]:
    """The locales a message is looked up in, most specific first, up to the source language, whose
    words are the messages themselves: the tag, its language, a shipped region of that language, then
    DEFAULT_LOCALE's own steps alike: `de-CH` -> (de-CH, de, en); `pt-PT` -> (pt-PT, pt, pt-BR, en);
    `en-GB` -> (en-GB, en)."""
    out: list[str] = []
    for candidate in (*_steps(tag), *_steps(config.get().default_locale), SOURCE):
        if candidate not in out:
            out.append(candidate)
        if candidate == SOURCE:
            break
    return tuple(out)


@lru_cache(maxsize=256)
def _plurals(identifier: str) -> tuple:
    """(CLDR's plural rule, its categories in CATEGORIES order) of a locale: Babel builds the rule
    anew on every `Locale.plural_form`, so it is kept here, once per process."""
    rule = Locale.parse(identifier).plural_form
    return rule, [c for c in CATEGORIES if c in rule.tags or c == "other"]


def plural_index(locale: Locale, count: int | float) -> int:
    """The form of `count` among the locale's plural forms (CLDR's categories, in CATEGORIES order)."""
    return _index(str(locale), count)


@lru_cache(maxsize=8192)
def _index(identifier: str, count: int | float) -> int:
    """plural_index by the locale's identifier: evaluating a CLDR rule takes Babel tens of
    microseconds, and the counts a digest says are few and small, so each is worked out once."""
    rule, tags = _plurals(identifier)
    return tags.index(rule(abs(count)))


def forms(locale_tag: str) -> int:
    """How many forms a plural message has in this locale: its CLDR categories."""
    return len(_plurals(str(_parse(locale_tag)))[1])


@dataclass(frozen=True)
class _Messages:
    """One catalog, as lookups need it: msgid -> translation (a str, or a tuple of plural forms)."""

    tag: str
    locale: Locale
    strings: dict
    identifier: str = ""  # the locale's, for the plural rule (str(Locale) is not free)


def _read(path: Path) -> Catalog:
    with path.open("rb") as f:
        return read_po(f)


def _load(tag: str) -> _Messages | None:
    path = CATALOG_DIR / f"{tag}.po"
    if not path.exists():
        return None
    strings: dict = {}
    for message in _read(path):
        if not message.id or message.fuzzy:
            continue
        key = message.id[0] if isinstance(message.id, tuple) else message.id
        value = message.string
        if (isinstance(value, tuple) and all(value)) or (isinstance(value, str) and value):
            strings[key] = value
    locale = _parse(tag)
    return _Messages(tag, locale, strings, str(locale))


_lock = threading.Lock()
_catalogs: dict[str, _Messages | None] = {}
_warned: set[tuple[str, str]] = set()


def catalog(tag: str) -> _Messages | None:
    """The catalog of `tag` (None: none is shipped), read once per process."""
    if tag in _catalogs:
        return _catalogs[tag]
    with _lock:
        if tag not in _catalogs:
            _catalogs[tag] = _load(tag)
    return _catalogs[tag]


def _fell_back(tag: str, msgid: str) -> None:
    metrics.I18N_FALLBACKS.labels(tag).inc()
    if (tag, msgid) not in _warned:
        _warned.add((tag, msgid))
        log.warning("locale %s has no translation of %r: the next locale of its chain is used", tag, msgid[:80])


class Translator:
    """The words of one locale: `gettext`, `ngettext` (CLDR plurals), lists, numbers and dates.
    Shared and cached per locale (`translator(tag)`); thread-safe (it only reads)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.locale = _parse(tag)
        self.language = tag  # what `lang` says in mails and pages
        self.direction = "rtl" if self.locale.character_order == "right-to-left" else "ltr"
        self.formats = Locale.parse(FORMAT_LOCALES[tag]) if tag in FORMAT_LOCALES else self.locale
        self._numbers: dict[int | float, str] = {}
        self._lists: dict[int, str] = {}
        self._patterns: dict[str, str] = {}
        # Resolved messages, kept once looked up (a digest says the same few dozen): msgid -> text,
        # (singular, plural, count) -> the count's form. A fallback is never kept: it is counted on
        # every use, as the metric says.
        self._texts: dict[str, str] = {}
        self._forms: dict[tuple[str, str, int | float], str] = {}
        # A plural message whose only value is its count ("6 min ago", "20 updates"), kept filled in.
        self._filled: dict[tuple[str, str, int | float], str] = {}
        # The catalogs before the source language (its words are the messages: no catalog needed).
        self._chain = [c for c in (catalog(t) for t in chain(tag) if t != SOURCE) if c is not None]
        self._counted = bool(self._chain) and self._chain[0].tag == tag

    def _lookup(self, msgid: str) -> tuple[str | tuple[str, ...], str] | None:
        """The translation along the chain, and the locale whose plural rules it follows; None: the
        source's own words. A message the locale's own catalog lacks is a fallback, counted."""
        for i, messages in enumerate(self._chain):
            found = messages.strings.get(msgid)
            if found is not None:
                if i and self._counted:
                    _fell_back(self.tag, msgid)
                return found, messages.identifier
        if self._counted:
            _fell_back(self.tag, msgid)
        return None

    def _fallback(self, msgid: str) -> bool:
        """Whether looking `msgid` up falls back from this locale's own catalog (counted each time)."""
        return self._counted and msgid not in self._chain[0].strings

    def translate(self, msgid: str) -> str:
        """`msgid` in this locale, its placeholders unfilled (pages fill them escaping the values)."""
        text = self._texts.get(msgid)
        if text is not None:
            return text
        found = self._lookup(msgid)
        text = found[0] if found is not None and isinstance(found[0], str) else msgid
        if not self._fallback(msgid) and len(self._texts) < MAX_KEPT_MESSAGES:
            self._texts[msgid] = text
        return text

    def translate_plural(self, singular: str, plural: str, count: int) -> str:
        """The form of `count` (CLDR) of a plural message, unfilled."""
        key = (singular, plural, count)
        text = self._forms.get(key)
        if text is not None:
            return text
        found = self._lookup(singular)
        if found is not None and isinstance(found[0], tuple):
            translated, identifier = found
            text = translated[min(_index(identifier, count), len(translated) - 1)]
        else:
            text = singular if count == 1 else plural
        if not self._fallback(singular) and len(self._forms) < MAX_KEPT_MESSAGES:
            self._forms[key] = text
        return text

    def gettext(self, msgid: str, **values: object) -> str:
        """`msgid` in this locale, its `{placeholders}` filled from `values`."""
        text = self.translate(msgid)
        return text.format(**values) if values else text

    def ngettext(self, singular: str, plural: str, count: int, **values: object) -> str:
        """The form of `count` (CLDR) of a plural message; `{count}` is the count in the locale's
        digits and separators."""
        if values:
            return self.translate_plural(singular, plural, count).format(count=self.number(count), **values)
        key = (singular, plural, count)
        text = self._filled.get(key)
        if text is None:
            text = self.translate_plural(singular, plural, count).format(count=self.number(count))
            if not self._fallback(singular) and len(self._filled) < MAX_KEPT_MESSAGES:
                self._filled[key] = text
        return text

    def number(self, value: int | float) -> str:
        """`value` with the locale's digits and separators (counts repeat: kept once formatted)."""
        shown = self._numbers.get(value)
        if shown is None:
            shown = format_decimal(value, locale=self.formats)
            if len(self._numbers) < MAX_KEPT_NUMBERS:
                self._numbers[value] = shown
        return shown

    def join(self, items: list[str]) -> str:
        """ "Ana, Bo and Cy" in English, "Ana, Bo e Cy" in Portuguese (CLDR's list pattern; in the
        pseudo-locale its words accented too)."""
        if not items:
            return ""
        return self._list_pattern(len(items)).format(*items)

    def _list_pattern(self, n: int) -> str:
        """CLDR's list pattern for n items as a format string ("{0}, {1} and {2}"), made once per n
        (format_list resolves the patterns on every call); accented in the pseudo-locale."""
        pattern = self._lists.get(n)
        if pattern is None:
            pattern = format_list([f"{{{i}}}" for i in range(n)], locale=self.formats)
            pattern = pattern.translate(_ACCENTS) if self.tag == PSEUDO else pattern
            self._lists[n] = pattern
        return pattern

    def _cldr(self, text: str) -> str:
        """CLDR's words (month and day names, "ago"), accented in the pseudo-locale like its messages."""
        return text.translate(_ACCENTS) if self.tag == PSEUDO else text

    def date(self, value: date | datetime, format: str = "long", zone: tzinfo | None = None) -> str:
        if isinstance(value, datetime):
            value = value.astimezone(zone) if zone else value
        return self._cldr(format_date(value, format=format, locale=self.formats))

    def moment(self, value: datetime, format: str = "medium", zone: tzinfo | None = None) -> str:
        """A date and time (`medium`: "3 Mar 2026, 09:00"), in `zone`."""
        return self._cldr(format_datetime(value, format=format, tzinfo=zone, locale=self.formats))

    def time(self, value: time | datetime, format: str = "short", zone: tzinfo | None = None) -> str:
        return self._cldr(format_time(value, format=format, tzinfo=zone, locale=self.formats))

    def skeleton(self, value: datetime, skeleton: str, zone: tzinfo | None = None) -> str:
        """A date by CLDR skeleton (`MMMd`, `yMMMMEEEEd`, `Hm`…): the locale orders the parts (the
        closest skeleton it has, by CLDR's matching)."""
        local = value.astimezone(zone) if zone else value
        pattern = self._patterns.get(skeleton)
        if pattern is None:  # CLDR's closest skeleton, matched once (format_skeleton matches per call)
            matched = match_skeleton(skeleton, self.formats.datetime_skeletons)
            if matched is None:
                return self._cldr(format_skeleton(skeleton, local, locale=self.formats))
            pattern = self._patterns[skeleton] = self.formats.datetime_skeletons[matched].pattern
        return self._cldr(format_datetime(local, pattern, locale=self.formats))

    def weekday(self, value: datetime, zone: tzinfo | None = None) -> str:
        """The day's full name: "Tuesday", "terça-feira", "火曜日"."""
        local = value.astimezone(zone) if zone else value
        return self._cldr(format_datetime(local, "EEEE", locale=self.formats))

    def ago(self, delta_seconds: float) -> str:
        """ "3 hours ago", "il y a 3 heures" (CLDR's relative time, rounded down to its unit)."""
        shown = format_timedelta(
            timedelta(seconds=-delta_seconds), add_direction=True, threshold=1, locale=self.formats
        )
        return self._cldr(shown)


@lru_cache(maxsize=64)
def _translator(tag: str) -> Translator:
    return Translator(tag)


def translator(tag: str | None = None) -> Translator:
    """The translator of a stored (normalised) tag; None: DEFAULT_LOCALE. A tag stored before a
    locale stopped being known falls back to DEFAULT_LOCALE rather than failing a mail."""
    try:
        return _translator(normalize(tag or config.get().default_locale))
    except LocaleError:
        return _translator(SOURCE)


def negotiate(accept_language: str | None) -> str:
    """The shipped locale an `Accept-Language` header prefers most; DEFAULT_LOCALE when none fits."""
    wanted: list[tuple[float, str]] = []
    for i, part in enumerate((accept_language or "").split(",")[:20]):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                continue
        if tag and tag != "*" and q > 0:
            wanted.append((-q, f"{i:02d}{tag}"))
    offered = {t.lower(): t for t in SHIPPED}
    for _, keyed in sorted(wanted):
        tag = keyed[2:].replace("_", "-").lower()
        for candidate in (tag, tag.split("-")[0]):
            if candidate in offered:
                return offered[candidate]
        for shipped_lower, shipped in offered.items():
            if shipped_lower.split("-")[0] == tag.split("-")[0]:
                return shipped
    return config.get().default_locale


def N_(message: str) -> str:
    """Marks a message for the catalogs where it is declared (a constant); it is translated where
    it is shown, with the reader's translator."""
    return message


def native_name(tag: str) -> str:
    """A locale in its own name: "Português (Brasil)", "العربية", "日本語"."""
    name = _parse(tag).get_display_name(_parse(tag)) or tag
    return name[:1].upper() + name[1:]
