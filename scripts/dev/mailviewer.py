"""Development mail sink and viewer — one process, never part of the production package.

    python -m scripts.dev.mailviewer     # SMTP sink on 127.0.0.1:1025 (aiosmtpd), mails stored as .eml
    http://127.0.0.1:8025/dev/mail       # newest first; each mail's HTML rendered in a sandboxed iframe

The sink writes into MAIL_FILE_DIR, the same folder the `file` provider writes to, so the viewer
shows mail from either provider. `make run` starts it (Procfile.dev); it refuses to run outside
APP_ENV=development/test.
"""

from __future__ import annotations

import argparse
import email
import email.policy
import html
import logging
import os
import re
import sys
import threading
import time
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path

import uvicorn
from aiosmtpd.controller import Controller
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from app.platform import config, favicon, observability

log = logging.getLogger("scripts.dev.mailviewer")

MAX_LISTED = 200
MAX_STORED = 2000  # the sink prunes the oldest files beyond this
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def mail_dir() -> Path:
    return Path(config.get().mail_file_dir)


# -- sink -------------------------------------------------------------------------------------
class SinkHandler:
    """aiosmtpd handler: every accepted message becomes <time>-<uuid>.eml (written atomically)."""

    def __init__(self, directory: Path, max_stored: int = MAX_STORED):
        self.directory = Path(directory)
        self.max_stored = max_stored
        self._count = 0
        self._lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        if len(envelope.content) > MAX_MESSAGE_BYTES:
            return "552 5.3.4 message too big for the dev sink"
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.eml"
        tmp = self.directory / (name + ".tmp")
        tmp.write_bytes(envelope.content)
        os.replace(tmp, self.directory / name)
        log.info(
            "caught mail from %s to %s (%d bytes) -> %s",
            envelope.mail_from,
            ", ".join(envelope.rcpt_tos),
            len(envelope.content),
            name,
        )
        with self._lock:
            self._count += 1
            if self._count % 100 == 0:
                self.prune()
        return "250 OK caught by the dev mail sink"

    def prune(self) -> None:
        files = sorted(self.directory.glob("*.eml"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[self.max_stored :]:
            old.unlink(missing_ok=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.dev.mailviewer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default=os.environ.get("MAIL_SINK_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("MAIL_SINK_PORT", "1025")), help="SMTP port")
    p.add_argument(
        "--web-port", type=int, default=int(os.environ.get("MAIL_VIEWER_PORT", "8025")), help="the viewer's HTTP port"
    )
    p.add_argument("--dir", help="where to store caught mail (default MAIL_FILE_DIR)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    observability.setup_logging()
    if not config.get().is_development:
        print("the mail sink and viewer are development tools (APP_ENV=development)", flush=True)
        return 2
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every SMTP verb at INFO
    directory = Path(args.dir or mail_dir())
    controller = Controller(
        SinkHandler(directory), hostname=args.host, port=args.port, data_size_limit=MAX_MESSAGE_BYTES
    )
    controller.start()
    log.info(
        "dev mail sink listening on %s:%d, storing mail in %s/; viewer on http://%s:%d/dev/mail",
        args.host,
        args.port,
        directory,
        args.host,
        args.web_port,
    )
    try:
        uvicorn.run(viewer_app(), host=args.host, port=args.web_port, log_level="warning")
    finally:
        controller.stop()
    return 0


# -- viewer -----------------------------------------------------------------------------------
def _parse(path: Path):
    return email.message_from_bytes(path.read_bytes()[:MAX_MESSAGE_BYTES], policy=email.policy.default)


def _mail_path(mail_id: str) -> Path | None:
    if not _ID_RE.fullmatch(mail_id) or mail_id.startswith("."):
        return None
    path = mail_dir() / f"{mail_id}.eml"
    return path if path.is_file() else None


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        + favicon.LINK
        + "<title>"
        + html.escape(title)
        + "</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:24px;color:#1f2933}table{border-collapse:collapse;"
        "width:100%}td,th{border-bottom:1px solid #e4e7eb;padding:6px 8px;text-align:left;font-size:14px;"
        "overflow-wrap:anywhere}iframe{display:block;width:100%;height:70vh;border:1px solid #cbd2d9;"
        "border-radius:6px}pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f5f7fa;padding:12px}"
        ".meta td{border:0;padding:2px 8px}.meta td:first-child{white-space:nowrap;overflow-wrap:normal}"
        "@media (max-width:600px){body{margin:12px}.meta td{display:block;padding:0 4px}"
        ".meta td:first-child{padding-top:6px}}</style></head><body>" + body + "</body></html>",
        headers={"Cache-Control": "no-store"},
    )


_FIT_FRAME = (
    "<script>for (const f of document.querySelectorAll('iframe.mail')) {"
    # measured at height 0, so the frame's own height never counts as the mail's
    "const fit = () => { f.style.height = '0px';"
    "f.style.height = f.contentDocument.documentElement.scrollHeight + 'px'; };"
    "f.addEventListener('load', fit); addEventListener('resize', fit);"
    "if (f.contentDocument && f.contentDocument.readyState === 'complete') fit(); }</script>"
)


def _dev_only():
    if not config.get().is_development:
        return Response(status_code=404)
    return None


def list_mail(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    directory = mail_dir()
    files = (
        sorted(directory.glob("*.eml"), key=lambda p: p.stat().st_mtime, reverse=True)[:MAX_LISTED]
        if directory.is_dir()
        else []
    )
    rows = []
    for path in files:
        try:
            msg = _parse(path)
            when = msg["Date"] and parsedate_to_datetime(msg["Date"]).strftime("%Y-%m-%d %H:%M:%S")
        except Exception:  # a half-broken file should not break the page
            msg, when = {}, ""
        rows.append(
            f"<tr><td>{html.escape(when or '')}</td><td>{html.escape(str(msg.get('To', '')))}</td>"
            f"<td><a href='/dev/mail/{html.escape(path.stem)}'>{html.escape(str(msg.get('Subject', '(no subject)')))}"
            f"</a></td></tr>"
        )
    body = (
        f"<h1>Caught mail</h1><p>{len(rows)} newest in <code>{html.escape(str(directory))}/</code> "
        "(the <code>mail-sink</code> process and the <code>file</code> provider write here).</p>"
        "<table><tr><th>Date</th><th>To</th><th>Subject</th></tr>" + "".join(rows) + "</table>"
    )
    if not rows:
        body += (
            "<p>Nothing yet. Digests go out at each subscriber's local hour; to get the demo "
            "subscribers' digests now run <code>python -m app digest-now --all</code>.</p>"
        )
    return _page("Caught mail", body)


def show_mail(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    path = _mail_path(request.path_params["mail_id"])
    if path is None:
        return _page("Not found", "<p>No such mail. <a href='/dev/mail'>Back</a></p>")
    msg = _parse(path)
    mail_id = html.escape(path.stem)
    meta = "".join(
        f"<tr><td><b>{name}</b></td><td>{html.escape(str(msg.get(name, '')))}</td></tr>"
        for name in ("From", "To", "Subject", "Date", "Message-ID", "List-Unsubscribe", "List-Unsubscribe-Post")
    )
    text_part = msg.get_body(("plain",))
    text = html.escape(text_part.get_content()) if text_part is not None else "(no text part)"
    body = (
        f"<p><a href='/dev/mail'>&larr; all mail</a> &middot; <a href='/dev/mail/{mail_id}/raw'>raw .eml</a></p>"
        f"<table class='meta'>{meta}</table><h2>HTML</h2>"
        # sandbox: the mail's HTML cannot run scripts; allow-same-origin lets this page read its
        # height, so the frame shows the whole mail, footer included, without a scroll box of its own
        f"<iframe class='mail' sandbox='allow-same-origin' src='/dev/mail/{mail_id}/html' title='mail HTML'></iframe>"
        + _FIT_FRAME
        + f"<h2>Plain text</h2><pre>{text}</pre>"
    )
    return _page(str(msg.get("Subject", "mail")), body)


def mail_html(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    path = _mail_path(request.path_params["mail_id"])
    if path is None:
        return Response(status_code=404)
    part = _parse(path).get_body(("html",))
    content = part.get_content() if part is not None else "<p>(no HTML part)</p>"
    # Scripts stay off; the same origin only lets the viewer page measure the mail (see show_mail).
    return HTMLResponse(
        content, headers={"Content-Security-Policy": "sandbox allow-same-origin", "Cache-Control": "no-store"}
    )


def mail_raw(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    path = _mail_path(request.path_params["mail_id"])
    if path is None:
        return Response(status_code=404)
    return Response(path.read_bytes(), media_type="text/plain; charset=utf-8")


routes = [
    favicon.route,
    Route("/", lambda request: RedirectResponse("/dev/mail"), methods=["GET"]),
    Route("/dev/mail", list_mail, methods=["GET"]),
    Route("/dev/mail/{mail_id}", show_mail, methods=["GET"]),
    Route("/dev/mail/{mail_id}/html", mail_html, methods=["GET"]),
    Route("/dev/mail/{mail_id}/raw", mail_raw, methods=["GET"]),
]


def viewer_app() -> Starlette:
    return Starlette(routes=routes)


if __name__ == "__main__":
    sys.exit(main())
