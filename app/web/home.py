"""What a person finds at the root of the web process: `/`, a small page linking the API reference,
the OpenAPI document, the dashboard and (in development) the mail viewer and the feed demo; `/docs`, the interactive
API reference — Swagger UI from a packaged copy (swagger-ui-bundle-v2) served by this app, so it
works offline and loads nothing from a CDN."""

from __future__ import annotations

import swagger_ui_bundle
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from app.platform import config, favicon
from app.web.pages import common

SWAGGER_UI_DIR = str(swagger_ui_bundle.swagger_ui_path)
ASSETS = "/docs/assets"

# Swagger UI sets inline styles and fetches /openapi.json; its scripts are files served here.
DOCS_HEADERS = {
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def home(request: Request) -> Response:
    settings = config.get()
    dev = settings.is_development  # the viewer and the feed demo are development tools
    response = common.templates.TemplateResponse(
        request,
        "home/index.html",
        {
            "css_url": common.CSS_URL,
            "mail_viewer_url": settings.mail_viewer_url if dev else "",
            "feed_demo_url": settings.feed_demo_url if dev else "",
        },
    )
    response.headers.update(DOCS_HEADERS)
    return response


def docs(request: Request) -> Response:
    response = common.templates.TemplateResponse(request, "home/docs.html", {"assets": ASSETS})
    response.headers.update(DOCS_HEADERS)
    return response


routes = [
    favicon.route,
    Route("/", home, methods=["GET"]),
    Route("/docs", docs, methods=["GET"]),
    Mount(ASSETS, StaticFiles(directory=SWAGGER_UI_DIR), name="docs-assets"),
]
