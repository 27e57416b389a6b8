"""`python -m scripts.dev.messages` (`make messages`): the message catalogs brought up to date.

1. Extract: every `gettext(...)` / `ngettext(...)` of the shipped code (app/, digest/, tracking/:
   Python, and the Jinja2 templates of app/web/templates/) into app/locale/messages.pot, with Babel's
   extractors.
2. Update: each shipped locale's app/locale/<tag>.po gets the new messages (empty, for its
   translator) and loses the ones the code no longer has (Babel's `Catalog.update`); its
   Plural-Forms header is CLDR's rule for the locale (app/platform/i18n.py picks forms by CLDR, so a
   plural message has one form per CLDR category).
3. Pseudo-locale: app/locale/en-XA.po is made from the template: every message accented, about 35 %
   longer and bracketed (`[Ŷöû ĝéţ ţĥîš ðåîļý ðîĝéšţ··· ]`), placeholders kept. A page or mail
   rendered in en-XA shows at once any English that did not come through a catalog.

`--check` changes nothing and exits 1 when a file is not what this script would write. Either way it
names every problem of a shipped catalog (`problems`: a message missing or untranslated, a
placeholder that is not the source's, plural forms other than CLDR's) and then exits 1; the catalog
test of `make test` (tests/checks/test_catalogs.py) runs the same checks. Translators edit the `.po`
files; docs/i18n.md says how to add a locale.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

from babel import Locale
from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po, write_po
from babel.plural import to_gettext

from app.platform import i18n

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("app", "digest", "tracking")
METHODS = [
    ("web/templates/**.html", "jinja2"),
    ("**.py", "python"),
]
KEYWORDS = {"gettext": None, "ngettext": (1, 2), "N_": None}
TEMPLATE = i18n.CATALOG_DIR / "messages.pot"
PROJECT = "Notify"


def extract() -> Catalog:
    catalog = Catalog(project=PROJECT, charset="utf-8", fuzzy=False)
    for top in SOURCES:
        for filename, lineno, message, comments, context in extract_from_dir(
            ROOT / top, METHODS, keywords=KEYWORDS, comment_tags=("Translators:",), strip_comment_tags=True
        ):
            catalog.add(message, None, [(f"{top}/{filename}", lineno)], auto_comments=comments, context=context)
    return catalog


def _plural_header(catalog: Catalog, tag: str) -> None:
    """Plural-Forms from CLDR (Babel's own default for a locale is gettext's older table)."""
    rule = to_gettext(Locale.parse(tag.replace("-", "_")).plural_form)
    catalog._num_plurals = int(re.match(r"nplurals=(\d+)", rule).group(1))  # type: ignore[union-attr]
    catalog._plural_expr = rule.split("plural=", 1)[1].rstrip(";")


def _render(catalog: Catalog) -> bytes:
    out = io.BytesIO()
    write_po(out, catalog, width=100, omit_header=False, sort_output=True, include_lineno=False)
    # The header's dates change on every run: keep them out so an unchanged catalog writes the same bytes.
    text = out.getvalue().decode()
    text = re.sub(r'"(POT-Creation-Date|PO-Revision-Date): [^"]*\\n"\n', "", text)
    return text.encode()


def updated(template: Catalog, tag: str) -> Catalog:
    path = i18n.CATALOG_DIR / f"{tag}.po"
    if path.exists():
        with path.open("rb") as f:
            catalog = read_po(f, locale=tag.replace("-", "_"))
    else:
        catalog = Catalog(locale=tag.replace("-", "_"), project=PROJECT, charset="utf-8", fuzzy=False)
    _plural_header(catalog, tag)  # before the update: new plural messages get one form per CLDR category
    catalog.update(template, no_fuzzy_matching=True)
    catalog.obsolete.clear()
    catalog.fuzzy = False
    return catalog


def pseudo(text: str) -> str:
    return i18n.pseudo(text)


def pseudo_catalog(template: Catalog) -> Catalog:
    catalog = Catalog(locale="en", project=PROJECT, charset="utf-8", fuzzy=False)
    _plural_header(catalog, "en")
    for message in template:
        if not message.id:
            continue
        if isinstance(message.id, tuple):
            string: str | tuple = (pseudo(message.id[0]), pseudo(message.id[1]))
        else:
            string = pseudo(message.id)
        catalog.add(message.id, string, message.locations, auto_comments=message.auto_comments)
    return catalog


_BRACES = re.compile(r"\{[^{}]*\}")
# Forms of a plural message that may say their number in words ("one update", "تحديثان").
_WORDED = ("zero", "one", "two")


def problems(catalog: Catalog, tag: str, template: Catalog) -> list[str]:
    """What makes a shipped catalog unfit: a message of the code missing or untranslated, a
    placeholder the source does not have (a `{cuont}` typo) or one it lacks, and plural forms other
    than CLDR's for the locale. Empty: fit."""
    out = []
    expected = i18n.forms(tag)
    if catalog.num_plurals != expected:
        out.append(f"{tag}: Plural-Forms has {catalog.num_plurals} forms, CLDR gives {tag} {expected}")
    tags = [c for c in i18n.CATEGORIES if c in i18n._parse(tag).plural_form.tags or c == "other"]
    for source in template:
        if not source.id:
            continue
        key = source.id[0] if isinstance(source.id, tuple) else source.id
        found = catalog.get(source.id)
        where = f"{tag}: {key!r}"
        if found is None or found.fuzzy:
            out.append(f"{where} is missing")
            continue
        wanted = set(_BRACES.findall(key if not isinstance(source.id, tuple) else source.id[1]))
        if isinstance(source.id, tuple):
            strings = found.string if isinstance(found.string, tuple) else (found.string,)
            if len(strings) != expected:
                out.append(f"{where} has {len(strings)} plural forms, CLDR gives {tag} {expected}")
            named = list(zip(tags, strings, strict=False))
        else:
            named = [("", found.string)]
        for category, string in named:
            if not string:
                out.append(f"{where} is not translated" + (f" (form {category})" if category else ""))
                continue
            have = set(_BRACES.findall(string))
            optional = {"{count}"} if category in _WORDED else set()
            if have - wanted or (wanted - optional) - have:
                out.append(f"{where}: placeholders {sorted(have)} are not the source's {sorted(wanted)}")
    return out


def shipped_problems() -> list[str]:
    """problems() of every shipped catalog, as they are on disk."""
    template = extract()
    out = []
    for tag in i18n.SHIPPED:
        if tag == i18n.SOURCE:
            continue
        path = i18n.CATALOG_DIR / f"{tag}.po"
        if not path.exists():
            out.append(f"{tag}: no catalog at {path.relative_to(ROOT)}")
            continue
        with path.open("rb") as f:
            out += problems(read_po(f, locale=tag.replace("-", "_")), tag, template)
    return out


def wanted() -> dict[Path, bytes]:
    """Every catalog file as this script writes it."""
    template = extract()
    files = {TEMPLATE: _render(template)}
    for tag in i18n.SHIPPED:
        if tag != i18n.SOURCE:
            files[i18n.CATALOG_DIR / f"{tag}.po"] = _render(updated(template, tag))
    files[i18n.CATALOG_DIR / f"{i18n.PSEUDO}.po"] = _render(pseudo_catalog(template))
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a catalog is out of date")
    args = p.parse_args(argv)
    stale = []
    for path, content in wanted().items():
        if not path.exists() or path.read_bytes() != content:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
    for path in stale:
        print(f"{'out of date' if args.check else 'written'}: {path.relative_to(ROOT)}")
    unfit = shipped_problems()
    for problem in unfit:
        print(problem, file=sys.stderr)
    if args.check and stale:
        print("run `make messages`, then translate what it left empty", file=sys.stderr)
    return 1 if (args.check and stale) or unfit else 0


if __name__ == "__main__":
    sys.exit(main())
