"""Naive baseline for scripts/bench/webhook.py, for comparison only: the obvious webhook endpoint.

A synchronous endpoint (run in Starlette's threadpool) that verifies the same signature, then opens
a transaction per request and INSERTs the events one statement at a time with ON CONFLICT DO
NOTHING, committing before it answers (so it is just as correct, only slower). The rows are sorted
by sg_event_id: unsorted, concurrent overlapping batches deadlock outright (seen in this bench).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.platform import config, db
from app.web import health
from tracking import signature, webhook_intake


def store(rows) -> int:
    stored = 0
    with db.database.connection_context(), db.database.atomic():
        for sg_id, event, email, payload in sorted(rows):
            cur = db.database.execute_sql(
                "INSERT INTO webhook_events (sg_event_id, event, email, payload) VALUES (%s, %s, %s, %s::jsonb) "
                "ON CONFLICT DO NOTHING",
                (sg_id, event, email, payload),
            )
            stored += cur.rowcount
    return stored


async def sendgrid(request: Request):
    body = await request.body()
    settings = config.get()
    try:
        signature.verify(
            settings.sendgrid_webhook_public_key,
            body,
            request.headers.get(signature.SIGNATURE_HEADER),
            request.headers.get(signature.TIMESTAMP_HEADER),
            settings.sendgrid_webhook_max_age_seconds,
        )
    except signature.SignatureError:
        return JSONResponse({"error": "bad_signature"}, status_code=403)
    rows = webhook_intake.rows_from_body(body)
    try:
        stored = await run_in_threadpool(store, rows)
    except Exception as exc:
        return JSONResponse({"error": "unavailable", "message": str(exc)}, status_code=503)
    return JSONResponse({"stored": stored, "duplicates": len(rows) - stored})


db.init()
naive_app = Starlette(routes=[Route("/webhooks/sendgrid", sendgrid, methods=["POST"]), *health.routes])
