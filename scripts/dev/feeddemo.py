"""Development demo of the in-app feed (issue 24) — one process, never part of the production package.

    python -m scripts.dev.feeddemo          # http://127.0.0.1:8026/?user=demo-ana

A page with a bell, as a product would build it on the public feed API: the unseen badge, the feed
(opening it marks the shown items seen), a click marks an item read, live updates over the
Server-Sent Events stream, and beside it the subscriber's next digest as it would be built now
(digest/build.py preview) — see something in the feed and it leaves the digest. "Send my digest
now" makes it due at once; it arrives in the mail viewer (http://127.0.0.1:8025/dev/mail).

This process mints the page's feed token itself (as the product's server would, with POST
/v1/subscribers/{user_id}/feed-token) and the page calls the API at FEED_DEMO_API (default: BASE_URL,
the web process); the web process must list this page's origin in FEED_ALLOWED_ORIGINS
(Procfile.dev does). It refuses to run outside APP_ENV=development/test.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from app.platform import config, db, favicon, observability, tokens
from digest import build as digest_build
from digest import feed
from digest import plan as digest_plan

log = logging.getLogger("scripts.dev.feeddemo")

DEFAULT_USER = "demo-ana"


def api_base() -> str:
    return os.environ.get("FEED_DEMO_API") or config.get().base_url


def _dev_only() -> Response | None:
    if config.get().env not in config.DEVELOPMENT_ENVS:
        return Response("the feed demo runs only with APP_ENV=development", status_code=404)
    return None


def _subscriber(request: Request) -> feed.Subscriber | None:
    return feed.find(request.query_params.get("user") or DEFAULT_USER)


def index(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    subscriber = _subscriber(request)
    if subscriber is None:
        return HTMLResponse(NOTE.replace("__NOTE__", NO_SUCH_USER), status_code=404)
    token = tokens.feed_token(subscriber.id, subscriber.token_version, int(time.time()) + 3600)
    boot = json.dumps({"api": api_base(), "token": token, "user": subscriber.user_id})
    page = PAGE.replace("__FONT__", FONT).replace("__BOOT__", html.escape(boot, quote=True))
    page = page.replace("__USER__", html.escape(subscriber.user_id))
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


def preview(request: Request):
    """The next digest as it would be built now, for the page's sandboxed frame."""
    if (denied := _dev_only()) is not None:
        return denied
    subscriber = _subscriber(request)
    rendered = digest_build.preview(subscriber.user_id) if subscriber else None
    body = rendered.html if rendered else NOTE.replace("__NOTE__", "Nothing unseen: no digest would be sent.")
    return HTMLResponse(body, headers={"Content-Security-Policy": "sandbox", "Cache-Control": "no-store"})


def send_now(request: Request):
    if (denied := _dev_only()) is not None:
        return denied
    subscriber = _subscriber(request)
    if subscriber is None:
        return JSONResponse({"runs": 0}, status_code=404)
    run_ids = digest_plan.send_next_now([subscriber.user_id])
    if run_ids:
        digest_plan.enqueue(run_ids)
    return JSONResponse({"runs": len(run_ids)})


routes = [
    favicon.route,
    Route("/", index, methods=["GET"]),
    Route("/demo/preview", preview, methods=["GET"]),
    Route("/demo/send-now", send_now, methods=["POST"]),
]


def demo_app() -> Starlette:
    return Starlette(routes=routes)


FONT = "system-ui, sans-serif"
NO_SUCH_USER = "No such subscriber. <code>make run</code> loads the demo users: demo-ana, demo-bo, …"
# The demo's short answers (an unknown user, an empty preview) in the page's own type.
NOTE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Feed demo</title></head>
<body style="font-family: {FONT}; margin: 0; padding: 12px 14px; color: #555; font-size: 15px; line-height: 1.5">
<p style="margin: 0">__NOTE__</p></body></html>
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" type="image/svg+xml" href="/favicon.ico">
<title>Feed demo — __USER__</title>
<style>
  body { font-family: __FONT__; margin: 0; background: #f4f5f7; color: #222; }
  header { display: flex; align-items: center; justify-content: space-between; padding: 12px 20px;
           background: #1f2a44; color: #fff; }
  #bell { position: relative; font-size: 24px; background: none; border: 0; color: #fff; cursor: pointer; }
  #badge { position: absolute; top: -4px; right: -10px; min-width: 18px; padding: 1px 5px; border-radius: 10px;
           background: #e5484d; color: #fff; font-size: 12px; font-weight: 700; }
  #badge[hidden] { display: none; }
  main { display: grid; grid-template-columns: minmax(280px, 420px) 1fr; gap: 20px; padding: 20px; }
  #panel { align-self: start; background: #fff; border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.15); }
  #panel[hidden] { display: none; }
  #panel h2 { font-size: 15px; margin: 0; padding: 12px 14px; border-bottom: 1px solid #e3e5e8; }
  #next .bar { display: flex; flex-wrap: wrap; align-items: center; justify-content: space-between; gap: 8px;
               padding: 8px 14px; border-bottom: 1px solid #e3e5e8; }
  #next h2 { font-size: 15px; margin: 0; padding: 4px 0; }
  #send-now { font: inherit; font-size: 13px; font-weight: 600; padding: 6px 12px; border: 0; border-radius: 6px;
              background: #2f6fed; color: #fff; cursor: pointer; }
  #send-now:hover { background: #2559c8; }
  #send-now:focus-visible { outline: 2px solid #1f2a44; outline-offset: 2px; }
  #items li.empty { cursor: default; color: #555; }
  #items { list-style: none; margin: 0; padding: 0; }
  #items li { padding: 10px 14px; border-bottom: 1px solid #eef0f2; cursor: pointer; }
  #items li.unread { background: #eef4ff; }
  #items li.unread .title::before { content: "\\25CF  "; color: #2f6fed; }
  #items .title { font-weight: 600; }
  #items .summary { font-size: 13px; color: #555; margin-top: 2px; }
  #next iframe { width: 100%; height: 640px; border: 0; background: #fff; border-radius: 0 0 8px 8px; }
  #next { grid-column: 2; background: #fff; border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.15); }
  #status { font-size: 12px; color: #cfd6e6; }
  @media (max-width: 700px) { main { grid-template-columns: 1fr; } #next { grid-column: 1; } }
</style></head>
<body data-boot="__BOOT__">
<header><div><b>Acme</b> <span id="status">connecting…</span></div>
  <button id="bell" aria-label="Notifications"><svg width="24" height="24" viewBox="0 0 24 24"
    fill="currentColor" aria-hidden="true"><path d="M12 22a2.5 2.5 0 0 0 2.45-2h-4.9A2.5 2.5 0 0 0 12 22zm7-6v-5a7 7 0
    0 0-5.5-6.84V3a1.5 1.5 0 0 0-3 0v1.16A7 7 0 0 0 5 11v5l-2 2v1h18v-1l-2-2z"/></svg><span id="badge" hidden>0</span>
  </button></header>
<main>
  <section id="panel" hidden><h2>Notifications</h2><ul id="items"></ul></section>
  <section id="next"><div class="bar"><h2>Next digest, if it were built now</h2>
    <button id="send-now" type="button">Send my digest now</button></div>
    <iframe id="preview" sandbox="" title="next digest" src="/demo/preview?user=__USER__"></iframe></section>
</main>
<script>
const boot = JSON.parse(document.body.dataset.boot);
const auth = {"Authorization": "Bearer " + boot.token};
const badge = document.getElementById("badge"), panel = document.getElementById("panel");
const list = document.getElementById("items"), statusLine = document.getElementById("status");

function showCount(n) { badge.textContent = String(n); badge.hidden = n === 0; }
function refreshPreview() {
  document.getElementById("preview").src = "/demo/preview?user=" + encodeURIComponent(boot.user) + "&t=" + Date.now();
}
async function api(path, body) {
  const r = await fetch(boot.api + path, body === undefined ? {headers: auth}
    : {method: "POST", headers: {...auth, "Content-Type": "application/json"}, body: JSON.stringify(body)});
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.status === 202 ? null : r.json();
}
function render(feed) {
  showCount(feed.unseen_count);
  if (!feed.items.length) {
    const empty = document.createElement("li"); empty.className = "empty";
    empty.textContent = "No notifications yet: events for " + boot.user + " show up here.";
    list.replaceChildren(empty);
    document.body.dataset.loaded = "1";
    return;
  }
  list.replaceChildren(...feed.items.map(item => {
    const li = document.createElement("li");
    li.className = item.unread ? "unread" : "read";
    li.dataset.entityType = item.entity_type; li.dataset.entityId = item.entity_id;
    const title = document.createElement("div"); title.className = "title"; title.textContent = item.title;
    const summary = document.createElement("div"); summary.className = "summary";
    summary.textContent = item.summary + " \\u00b7 " + (item.lines[0] ? item.lines[0].when : "");
    li.append(title, summary);
    li.addEventListener("click", async () => {
      await api("/v1/feed/read", {entities: [{entity_type: item.entity_type, entity_id: item.entity_id}]});
      li.className = "read"; refreshPreview();
    });
    return li;
  }));
  document.body.dataset.loaded = "1";
}
async function load() { const feed = await api("/v1/feed?limit=20"); render(feed); return feed; }
async function openFeed() {
  const feed = await load();
  // Closed while the feed was on its way (a stream update can open it in the background): what
  // arrived was never on screen, so it is not seen; the badge keeps counting it.
  if (panel.hidden) return;
  const shown = feed.items.filter(i => !i.seen).map(i => ({entity_type: i.entity_type, entity_id: i.entity_id}));
  if (shown.length) { await api("/v1/feed/seen", {entities: shown}); showCount(0); refreshPreview(); }
}
document.getElementById("bell").addEventListener("click", async () => {
  panel.hidden = !panel.hidden;
  if (!panel.hidden) await openFeed();
});
document.getElementById("send-now").addEventListener("click", async () => {
  await fetch("/demo/send-now?user=" + encodeURIComponent(boot.user), {method: "POST"});
  statusLine.textContent = "digest sent: see the mail viewer";
});
// Server-Sent Events over fetch(): EventSource cannot send the Authorization header.
async function stream(lastId) {
  const headers = {...auth}; if (lastId) headers["Last-Event-ID"] = lastId;
  try {
    const r = await fetch(boot.api + "/v1/feed/stream", {headers});
    if (!r.ok) throw new Error("stream " + r.status);
    statusLine.textContent = "live";
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\\n\\n")) >= 0) {
        const block = buffer.slice(0, end); buffer = buffer.slice(end + 2);
        const fields = {};
        for (const line of block.split("\\n")) {
          if (line.startsWith(":")) continue;
          const at = line.indexOf(": "); if (at > 0) fields[line.slice(0, at)] = line.slice(at + 2);
        }
        if (fields.id) lastId = fields.id;
        if (fields.data) {
          const data = JSON.parse(fields.data);
          if (panel.hidden) showCount(data.unseen_count); else await openFeed();
          if (data.items.length) refreshPreview();
          document.body.dataset.events = String(Number(document.body.dataset.events || 0) + 1);
        }
      }
    }
  } catch (e) { statusLine.textContent = "reconnecting…"; }
  setTimeout(() => stream(lastId), 3000);
}
load().then(() => stream(null));
</script></body></html>
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the in-app feed demo page (development only)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(os.environ.get("FEED_DEMO_PORT", "8026")))
    args = p.parse_args(argv)
    config.reload()
    if config.get().env not in config.DEVELOPMENT_ENVS:
        print("the feed demo runs only with APP_ENV=development", file=sys.stderr)
        return 2
    observability.setup_logging()
    db.init()
    log.info("feed demo on http://%s:%d/?user=%s (API %s)", args.host, args.port, DEFAULT_USER, api_base())
    uvicorn.run(demo_app(), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
