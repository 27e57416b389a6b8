"""Naive baseline for scripts/bench/ingest.py: what a first version usually looks like.

A sync endpoint (Starlette's threadpool), a fresh connection per request, one INSERT per event,
one commit per request. Same validation and same table as the real endpoint.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.platform import apikeys, db
from digest import ingest


async def post_events(request: Request):
    key = request.headers.get("authorization", "").partition(" ")[2]
    body = json.loads(await request.body())
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_store, key, body)


def _store(key, body):
    principal = apikeys.cache.lookup(key)
    if principal is None:
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    rows, errors = ingest.validate_body(body, principal.name)
    if errors:
        return JSONResponse({"errors": errors}, status_code=422)
    accepted = 0
    with db.raw_cursor() as cur:
        for row in rows:
            cur.execute(
                "INSERT INTO digest_events (source, producer_id, user_id, category, entity_type, entity_id, "
                "actor_id, actor_name, payload, occurred_at, high_priority) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,"
                "%s::jsonb, COALESCE(%s::timestamptz, now()), %s) ON CONFLICT DO NOTHING",
                row,
            )
            accepted += cur.rowcount
    return JSONResponse({"accepted": accepted, "duplicates": len(rows) - accepted}, status_code=202)


async def healthz(request):
    return JSONResponse({"status": "ok"})


db.init()
app = Starlette(routes=[Route("/v1/events", post_events, methods=["POST"]), Route("/healthz", healthz)])
