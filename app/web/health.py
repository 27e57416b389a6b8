"""Operations endpoints. GET /healthz: 200 when Postgres and Redis both answer, 503 naming the one
that does not. GET /metrics: Prometheus exposition (app/platform/metrics.py) for an admin API key or
METRICS_TOKEN, as a Bearer token — on the web app, and alone on the metrics exporter
(`python -m app metrics-exporter`) of hosts that run workers but no web process."""

from __future__ import annotations

import contextlib

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.platform import config, db, metrics
from app.platform.http import FastJSONResponse, exception_handlers, require_key
from app.platform.openapi import Answer, Example, Operation, api_route


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


async def metrics_endpoint(request: Request):
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    if not (kind.lower() == "bearer" and metrics.token_matches(token.strip())):
        await require_key(request, "admin")  # 401 without a valid key, 403 for another scope
    return Response(await run_in_threadpool(metrics.scrape), media_type=metrics.CONTENT_TYPE)


routes = [
    api_route(
        "/healthz",
        healthz,
        get=Operation(
            "Postgres and Redis reachability",
            {200: "both answer", 503: "one does not"},
            example=Example(
                answers={
                    200: {"status": "ok", "postgres": "ok", "redis": "ok"},
                    503: {
                        "status": "degraded",
                        "postgres": "ok",
                        "redis": "error: ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused.",
                    },
                }
            ),
        ),
    ),
    api_route(
        "/metrics",
        metrics_endpoint,
        # The endpoint checks the key itself: METRICS_TOKEN is accepted too.
        get=Operation(
            "Prometheus metrics of every process (admin key or METRICS_TOKEN)",
            {200: "text exposition format"},
            bearer=True,
            example=Example(
                answers={
                    200: Answer(
                        metrics.CONTENT_TYPE,
                        "# HELP notify_events_total Events by outcome of POST /v1/events\n"
                        "# TYPE notify_events_total counter\n"
                        'notify_events_total{result="accepted"} 2.0\n',
                    )
                }
            ),
        ),
    ),
]


def exporter_app() -> Starlette:
    """GET /metrics alone: a worker-only host's values (its PROMETHEUS_MULTIPROC_DIR), with the web
    app's exposition and credentials. Prometheus scrapes every host; counters are per host."""
    db.init()  # API keys are checked against Postgres, as on the web app
    metrics.setup()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        db.close_all()
        metrics.process_stopped()

    return Starlette(
        routes=[Route("/metrics", metrics_endpoint, methods=["GET"])],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
