"""Every server the project runs answers /favicon.ico with its icon and links it from its pages: the
app, the development mail viewer and the feed demo (each used to answer it with a 404)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from app.platform import favicon
from scripts.dev import feeddemo, mailviewer
from tests import factories


def _icon_served(client) -> None:
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    assert r.content == favicon.ICON and r.content.startswith(b"<svg")


def test_the_app_serves_its_icon_and_every_kind_of_page_links_it(client):
    _icon_served(client)
    for path in ("/", "/docs", "/admin/login"):
        assert favicon.LINK in client.get(path).text, path


@pytest.mark.parametrize("server", [mailviewer.viewer_app, feeddemo.demo_app], ids=["mail viewer", "feed demo"])
def test_the_development_servers_serve_it_too(server, settings, tmp_path):
    settings(env="development", mail_file_dir=str(tmp_path))
    factories.subscriber(feeddemo.DEFAULT_USER)  # the feed demo's page is a demo subscriber's
    with TestClient(server()) as client:
        _icon_served(client)
        page = client.get("/", follow_redirects=True)
        assert page.status_code == 200 and favicon.LINK in page.text
