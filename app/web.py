"""The web process: JSON API, tracking endpoints, subscriber pages. `app.web:app` for uvicorn."""
from __future__ import annotations

import contextlib
import gc
import importlib
import logging

from starlette.applications import Starlette
from starlette.routing import Route

from app import config, db, openapi, observability
from app.http import ApiError, api_error_handler

log = logging.getLogger("app.web")

# Each module exposes `routes` and may expose OPENAPI_PATHS / OPENAPI_SCHEMAS.
ROUTE_MODULES = (
    "tracking.routes",  # first: the click/open hot path then skips matching every other route
    "app.health",
    "app.api.events",
    "app.api.subscribers",
    "app.api.newsletters",
    "app.pages",
    "tracking.webhooks",
)


def create_app() -> Starlette:
    settings = config.get()
    observability.setup_logging()
    observability.init_sentry("web")
    db.init()
    modules = [importlib.import_module(name) for name in ROUTE_MODULES]
    routes = [route for module in modules for route in module.routes]
    routes.append(Route("/openapi.json", openapi.endpoint(openapi.build(modules)), methods=["GET"]))
    if settings.is_development:
        from app import mailviewer
        routes.extend(mailviewer.routes)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("web process up (env=%s)", settings.env)
        # Long-lived start-up objects leave the collector's view, and young-generation collections
        # run less often: fewer pauses on the hot paths' tail latency.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        yield
        for module in modules:  # e.g. tracking flushes its buffered click history (SIGTERM loses none)
            if hasattr(module, "on_shutdown"):
                module.on_shutdown()
        db.database.close_all()

    return Starlette(routes=routes, exception_handlers={ApiError: api_error_handler}, lifespan=lifespan)


app = create_app()
