"""Template compile + render.

Templates are files an operator can replace (DIGEST_TEMPLATE_DIR, default digest/templates):
  digest.html   Mustache; an HTML fragment goes inside the mail layout (app/platform/mail_layout.py: brand
                header, card, colours from settings), a full document (<html>) is used as it is;
                its <style> is inlined by premailer ONCE per template version (app/platform/css_inline.py)
  digest.txt    Mustache; the plain-text part (use {{{triple}}} tags: no HTML escaping)
  subject.txt   Mustache; one line

A "version" is (path, mtime, size, brand settings): editing a file recompiles it on the next render (checked at most
once a second), otherwise renders reuse the cached token list, compiled once into Python
(app/platform/mustache.py, the Mustache implementation newsletters use too).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.platform import config, mail, mail_layout, mustache
from app.platform.css_inline import inline_css

log = logging.getLogger("digest.render")

DEFAULT_DIR = Path(__file__).parent / "templates"
NAMES = ("digest.html", "digest.txt", "subject.txt")
STAT_EVERY_SECONDS = 1.0


class TemplateError(RuntimeError):
    """A template is missing or premailer broke its Mustache tags."""


@dataclass(frozen=True)
class Compiled:
    version: tuple
    tokens: tuple
    template: mustache.Template
    # digest.html written in ASCII as it renders (mustache.Template ascii=True), when that is the same
    # as mail.ascii_html of `template`'s document (mail.renders_as_ascii); else None
    ascii: mustache.Template | None = field(default=None, compare=False)
    # The settings object it was last checked under. Settings are replaced, never changed, so the
    # same object means the same brand: the per-render check is one identity comparison.
    settings: object = field(default=None, compare=False)


@dataclass(frozen=True)
class Rendered:
    subject: str
    html: str
    text: str


def template_dir() -> Path:
    configured = getattr(config.get(), "digest_template_dir", "")
    return Path(configured) if configured else DEFAULT_DIR


def compile_source(source: str, html: bool, brand: mail_layout.Brand | None = None) -> tuple:
    """Source -> cached token tuple. For HTML, the layout around a fragment, then premailer;
    refuse a result that lost tags."""
    if html:
        if mail_layout.is_fragment(source):
            source = mail_layout.wrap(source, brand)
        inlined = inline_css(source, strip_important=False)
        if mustache.tags(mustache.tokenize(inlined)) != mustache.tags(mustache.tokenize(source)):
            raise TemplateError(
                "premailer changed the Mustache tags of the HTML template; write attributes "
                'as href="{{url}}" and keep section tags outside <table> rows'
            )
        source = inlined
    return mustache.tokenize(source)


class TemplateSet:
    """Compiled digest templates of one directory, recompiled when a file changes."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._compiled: dict[str, Compiled] = {}
        self._checked_at = 0.0
        self._lock = threading.Lock()

    def _version(self, name: str, brand: mail_layout.Brand) -> tuple:
        path = self.directory / name
        try:
            st = path.stat()
        except FileNotFoundError:
            raise TemplateError(f"digest template {path} does not exist") from None
        return (str(path), st.st_mtime_ns, st.st_size, brand)

    def get(self, name: str) -> Compiled:
        now = time.monotonic()
        compiled = self._compiled.get(name)
        settings = config.get()
        if compiled is not None and compiled.settings is settings and now - self._checked_at < STAT_EVERY_SECONDS:
            return compiled
        with self._lock:
            brand = mail_layout.Brand.from_settings(settings)
            version = self._version(name, brand)
            compiled = self._compiled.get(name)
            if compiled is None or compiled.version != version:
                started = time.perf_counter()
                source = Path(version[0]).read_text(encoding="utf-8")
                tokens = compile_source(source, html=name.endswith(".html"), brand=brand)
                try:
                    writes_ascii = name.endswith(".html") and mail.renders_as_ascii(tokens)
                    ascii = mustache.Template(tokens, ascii=True) if writes_ascii else None
                    compiled = Compiled(version, tokens, mustache.Template(tokens), ascii, settings)
                except mustache.MustacheError as exc:
                    raise TemplateError(f"{version[0]}: {exc}") from None
                self._compiled[name] = compiled
                log.info("compiled digest template %s in %.1f ms", version[0], (time.perf_counter() - started) * 1e3)
            elif compiled.settings is not settings:
                compiled = self._compiled[name] = replace(compiled, settings=settings)
            if all(n in self._compiled for n in NAMES):
                self._checked_at = now
            return compiled

    def render(self, context: dict) -> Rendered:
        subject, html, context = self.render_html(context)
        return Rendered(subject=subject, html=html, text=self.render_text(context))

    def render_html(self, context: dict) -> tuple[str, str, dict]:
        """(subject, HTML, the context with its subject) — the text part can follow once the
        HTML's links are known (digest/build.py puts the same click-tracking links in it). The HTML
        is ASCII (app/mail.ascii_html), so it goes as 7bit rather than quoted-printable: written so as
        it renders where the template allows (a locale's words kept as references once written)."""
        subject = " ".join(self.get("subject.txt").template.render(context).split())[:200]  # one line
        context = {**context, "subject": subject}
        compiled = self.get("digest.html")
        return subject, mail.ascii_html((compiled.ascii or compiled.template).render(context)), context

    def render_text(self, context: dict) -> str:
        return self.get("digest.txt").template.render(context)


_sets: dict[str, TemplateSet] = {}  # by DIGEST_TEMPLATE_DIR as configured ("": the default)
_sets_lock = threading.Lock()


def templates() -> TemplateSet:
    # Keyed by the setting's string: hashing a Path on every render cost ~5 us a digest.
    configured = getattr(config.get(), "digest_template_dir", "") or ""
    ts = _sets.get(configured)
    if ts is None:
        with _sets_lock:
            ts = _sets.setdefault(configured, TemplateSet(template_dir()))
    return ts


def render(context: dict) -> Rendered:
    return templates().render(context)


def warm_up_in_background() -> None:
    """Compile the templates now (premailer import + run: ~0.5 s) in a daemon thread, so a worker's
    first digest does not pay for it. Errors are logged; the first render reports them again."""

    def run():
        try:
            ts = templates()
            for name in NAMES:
                ts.get(name)
        except Exception:
            log.exception("digest templates failed to compile")

    threading.Thread(target=run, name="digest-template-warmup", daemon=True).start()
