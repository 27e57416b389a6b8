"""The mail layout: brand header, a card of at most 600 px, colours from settings, around digest
bodies and newsletter bodies that are HTML fragments.

A fragment is a body without <html>, <body> or a doctype; a full document is left alone (its author
did the layout). In a fragment:
  <title>…</title> and <style>…</style>   moved into the layout's <head>
  <!-- layout:before -->                   what follows goes above the brand header, in the
                                          column (a preheader, a "view in your browser" link)
  <!-- layout:card -->                     what follows goes in the card (also where unmarked text goes)
  <!-- layout:after -->                    what follows goes under the card, small and centred
                                          (footers)
Markers are optional and are written in that order. The document's language and direction are the
reader's (`{{lang}}`, `{{dir}}`: every digest and newsletter context holds them, app/platform/i18n.py).
Wrapping happens when a template is compiled,
before premailer inlines the CSS, so a mail pays nothing for it. The brand values were validated
at start-up (app/platform/config.py check_brand): colours are #rgb/#rrggbb and the logo an https URL
without quotes, so neither can carry markup or CSS; the name is HTML-escaped.

Responsive without media queries (which many mail clients drop): the card is fluid up to 600 px,
images never exceed it and long words wrap, so a 390 px phone shows it without sideways scrolling
(tests/browser/test_mail.py).
"""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass

from app.platform import config

_FULL_DOCUMENT = re.compile(r"(?i)<\s*(?:!doctype|html|body)\b")
_HEAD_PARTS = re.compile(r"(?is)<(title|style)\b[^>]*>.*?</\1\s*>")
_MARKER = re.compile(r"<!--\s*layout:(before|card|after)\s*-->")
REGIONS = ("before", "card", "after")


@dataclass(frozen=True)
class Brand:
    name: str
    logo_url: str
    color: str
    background: str

    @classmethod
    def from_settings(cls, settings: config.Settings | None = None) -> Brand:
        settings = settings or config.get()
        return cls(settings.brand_name, settings.brand_logo_url, settings.brand_color, settings.brand_background)


def is_fragment(source: str) -> bool:
    return not _FULL_DOCUMENT.search(source)


def regions(fragment: str) -> tuple[str, dict[str, str]]:
    """(head parts, {region: html}) of a fragment."""
    head = "".join(m.group(0) for m in _HEAD_PARTS.finditer(fragment))
    body = _HEAD_PARTS.sub("", fragment)
    out = dict.fromkeys(REGIONS, "")
    region, pos = "card", 0
    for marker in _MARKER.finditer(body):
        out[region] += body[pos : marker.start()]
        region, pos = marker.group(1), marker.end()
    out[region] += body[pos:]
    return head, out


def _css(brand: Brand) -> str:
    return f"""<style>
  body {{ margin: 0; padding: 0; background: {brand.background}; color: #1f2933;
         font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }}
  a {{ color: {brand.color}; }}
  .layout {{ max-width: 600px; margin: 0 auto; padding: 24px 16px; }}
  .layout-header {{ padding: 0 4px 16px 4px; }}
  .layout-brand {{ font-size: 18px; font-weight: 700; color: {brand.color}; text-decoration: none; }}
  .layout-logo {{ display: block; height: 32px; width: auto; max-width: 100%; border: 0; }}
  .layout-card {{ background: #ffffff; border-radius: 8px; border-top: 4px solid {brand.color}; padding: 24px;
                 overflow-wrap: break-word; word-wrap: break-word; word-break: break-word; }}
  .layout-card img {{ max-width: 100%; }}
  .layout-card table {{ max-width: 100%; }}
  .layout-after {{ padding: 16px 8px; font-size: 12px; line-height: 18px; color: #7b8794; text-align: center;
                  overflow-wrap: break-word; word-wrap: break-word; word-break: break-word; }}
  .layout-after a {{ color: #7b8794; }}
</style>
"""


def wrap(fragment: str, brand: Brand | None = None) -> str:
    """The fragment inside the layout, as one HTML document (Mustache tags untouched)."""
    brand = brand or Brand.from_settings()
    head, parts = regions(fragment)
    name = html_lib.escape(brand.name)
    if "<title" not in head.lower():
        head = f"<title>{name}</title>\n{head}"
    if brand.logo_url:
        mark = f'<img class="layout-logo" src="{html_lib.escape(brand.logo_url)}" alt="{name}" height="32">'
    else:
        mark = f'<span class="layout-brand">{name}</span>'
    after = f'<div class="layout-after">\n{parts["after"].strip()}\n</div>\n' if parts["after"].strip() else ""
    return (
        '<!DOCTYPE html>\n<html lang="{{lang}}" dir="{{dir}}">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"{head}\n{_css(brand)}</head>\n<body>\n"
        '<div class="layout">\n'
        f"{parts['before'].strip()}\n"
        f'<div class="layout-header">{mark}</div>\n'
        f'<div class="layout-card">\n{parts["card"].strip()}\n</div>\n'
        f"{after}"
        "</div>\n</body>\n</html>\n"
    )
