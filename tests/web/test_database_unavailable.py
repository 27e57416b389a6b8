"""While Postgres does not answer, every route answers 503 with Retry-After — authentication,
tracking, pages and webhooks included — never a 500, and logs no traceback.

The outage is real: the app is pointed at a port where nothing listens (connection refused), the
same error a restarting Postgres gives."""

from __future__ import annotations

import logging

import pytest
from starlette.testclient import TestClient

from app.platform import config, db, tokens
from tracking.links import click_url, pixel_url

DOWN_URL = "postgresql://127.0.0.1:1/notify_down"


@pytest.fixture
def down(settings, database_url):
    settings(database_url=DOWN_URL, db_pool_timeout_seconds=1.0)
    db.init(DOWN_URL)
    try:
        from app.web import app

        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        db.init(database_url)


ROUTES = [
    (
        "POST",
        "/v1/events",
        {"json": {"id": "e1", "user_id": "u1", "category": "like", "entity_type": "post", "entity_id": "p1"}},
    ),
    ("PUT", "/v1/subscribers/u1", {"json": {"email": "u1@example.com"}}),
    ("GET", "/v1/subscribers/u1", {}),
    ("POST", "/v1/newsletters", {"json": {"subject": "s", "html": "<p>{{unsubscribe_url}}</p>"}}),
    ("GET", "/v1/newsletters/1", {}),
    ("GET", "/u/{unsubscribe}", {}),
    ("POST", "/u/{unsubscribe}", {"data": {"List-Unsubscribe": "One-Click"}}),
    ("GET", "/preferences/{preferences}", {}),
    ("GET", "/c/{click}", {}),
    ("GET", "/o/{open}", {}),
    (
        "POST",
        "/webhooks/sendgrid",
        {"json": [{"email": "a@example.com", "event": "open", "sg_event_id": "x1", "timestamp": 1700000000}]},
    ),
]


@pytest.mark.parametrize("method, path, kwargs", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_answers_503_with_retry_after_while_postgres_is_down(down, method, path, kwargs, caplog):
    path = path.format(
        unsubscribe=tokens.make("unsubscribe", 1),
        preferences=tokens.make("preferences", 1),
        click=click_url(1, 1).rsplit("/c/", 1)[1],
        open=pixel_url("digest", 1, 1).rsplit("/o/", 1)[1],
    )
    headers = {"Authorization": "Bearer nk_some-key-the-cache-has-never-seen"}
    with caplog.at_level(logging.WARNING):
        response = down.request(method, path, headers=headers, **kwargs)
    if path.startswith("/o/"):  # the pixel never fails a mail client: the open is buffered, a GIF answered
        assert response.status_code == 200
        return
    assert response.status_code == 503, (response.status_code, response.text[:200])
    assert response.headers.get("retry-after")
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR], "traceback logged"
    assert config.get().database_url == DOWN_URL
