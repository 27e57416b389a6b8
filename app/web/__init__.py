"""The web process, `app.web:app` for uvicorn: the JSON API (api/), click and open tracking,
SendGrid's webhook, the subscriber pages (pages/), the operator dashboard (admin/), health and
metrics, `/` and the `/docs` API reference, and /openapi.json generated from the routes."""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging

from starlette.applications import Starlette
from starlette.routing import Route

from app.platform import config, db, forwarded, memory, metrics, observability, openapi
from app.platform.http import exception_handlers

log = logging.getLogger("app.web")

# Each module exposes `routes`; those declared with app.platform.openapi.api_route are documented.
ROUTE_MODULES = (
    "app.web.tracking",  # first: the click/open hot path then skips matching every other route
    "app.web.health",
    "app.web.api.events",
    "app.web.api.subscribers",
    "app.web.api.newsletters",
    "app.web.api.categories",
    "app.web.api.feed",
    "app.web.api.feed_browser",
    "app.web.pages",
    "app.web.admin",
    "app.web.webhooks",
    "app.web.home",  # /, /docs
)


def create_app() -> Starlette:
    settings = config.get()
    observability.setup_logging()
    observability.init_sentry("web")
    db.init()
    metrics.setup()  # PROMETHEUS_MULTIPROC_DIR exists; dead processes' live gauges are gone
    forwarded.trusted_proxies()  # a malformed FORWARDED_ALLOW_IPS is a start-up error, not a 500 per click
    modules = [importlib.import_module(name) for name in ROUTE_MODULES]
    for module in modules:  # e.g. the webhook refuses a malformed public key now, not per request
        if hasattr(module, "check_config"):
            module.check_config(settings)
    routes = [route for module in modules for route in module.routes]
    routes.append(Route("/openapi.json", openapi.endpoint(openapi.build(routes)), methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("web process up (env=%s)", settings.env)
        # Long-lived start-up objects leave the collector's view, and young-generation collections
        # run less often: fewer pauses on the hot paths' tail latency.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        memory.limit_malloc_arenas(settings.malloc_arenas)  # before the threadpool's threads exist
        yield
        for module in modules:  # e.g. tracking flushes its buffered click history (SIGTERM loses none)
            if hasattr(module, "on_shutdown"):
                module.on_shutdown()
        db.close_all()
        metrics.process_stopped()

    return Starlette(routes=routes, exception_handlers=exception_handlers(), lifespan=lifespan)


app = create_app()
