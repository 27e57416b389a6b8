"""GET /healthz: 200 when Postgres and Redis both answer, 503 naming the one that does not."""
from __future__ import annotations

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from app import config, db
from app.http import FastJSONResponse


def check() -> dict:
    result = {}
    try:
        db.query("SELECT 1")
        result["postgres"] = "ok"
    except Exception as exc:  # any failure is a failed check
        result["postgres"] = f"error: {exc.__class__.__name__}: {str(exc).strip()[:200]}"
    try:
        client = redis.Redis.from_url(config.get().redis_url, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.close()
        result["redis"] = "ok"
    except Exception as exc:
        result["redis"] = f"error: {exc.__class__.__name__}: {str(exc)[:200]}"
    return result


async def healthz(request: Request):
    result = await run_in_threadpool(check)
    ok = all(v == "ok" for v in result.values())
    return FastJSONResponse({"status": "ok" if ok else "degraded", **result}, status_code=200 if ok else 503)


routes = [Route("/healthz", healthz, methods=["GET"])]
OPENAPI_PATHS = {"/healthz": {"get": {"summary": "Postgres and Redis reachability",
                                      "responses": {"200": {"description": "both answer"},
                                                    "503": {"description": "one does not"}}}}}
