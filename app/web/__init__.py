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
    "app.web.provider_webhooks",
    "app.web.home",  # /, /docs
)


# The API reference's groups, in the order /docs shows them: the public API first, what mail and
# providers call next, health last. Every documented path belongs to one (openapi.tag_of).
API_TAGS = (
    openapi.Tag(
        "events",
        "Product services post what happened to whom; each event waits for its subscriber's next digest "
        "(or goes now, when urgent).",
        ("/v1/events",),
    ),
    openapi.Tag(
        "subscribers",
        "Who receives what: address, cadence, hour and time zone, opt-outs; erasure.",
        ("/v1/subscribers",),
    ),
    openapi.Tag(
        "categories",
        "The kinds of events: their label and verb in mail, and whether they can wait for the digest.",
        ("/v1/categories",),
    ),
    openapi.Tag(
        "feed",
        "The same events in the product's own UI: the in-app feed, read and seen marks (a seen event "
        "stays out of the digest), a token for the browser.",
        (
            "/v1/feed",
            "/v1/subscribers/{user_id}/feed",
            "/v1/subscribers/{user_id}/feed-token",
            "/v1/subscribers/{user_id}/read",
            "/v1/subscribers/{user_id}/seen",
        ),
    ),
    openapi.Tag(
        "newsletters",
        "One mail to many: create, test, send (now or at a time), pause, resume, cancel, retry failures.",
        ("/v1/newsletters",),
    ),
    openapi.Tag("webhooks", "What providers report back: deliveries, bounces, complaints, opens.", ("/webhooks",)),
    openapi.Tag(
        "tracking",
        "The links and the open pixel inside every mail (no authentication: the codes are signed).",
        ("/c", "/o"),
    ),
    openapi.Tag("operations", "Health for load balancers, metrics for Prometheus.", ("/healthz", "/metrics")),
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
    routes.append(Route("/openapi.json", openapi.endpoint(openapi.build(routes, API_TAGS)), methods=["GET"]))

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
