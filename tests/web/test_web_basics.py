"""Health check, OpenAPI document, configuration errors, API key CLI."""

from __future__ import annotations

import os
import subprocess
import sys

from app.cli import main as cli_main
from app.platform import apikeys, config, db


def test_healthz_ok(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "postgres": "ok", "redis": "ok"}


def test_healthz_reports_redis_down(client, settings):
    settings(redis_url="redis://127.0.0.1:1/0")
    r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["postgres"] == "ok" and r.json()["redis"].startswith("error")


def test_openapi_describes_the_api(client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path, method in [
        ("/v1/events", "post"),
        ("/v1/subscribers/{user_id}", "put"),
        ("/v1/subscribers/{user_id}", "get"),
        ("/v1/subscribers/{user_id}", "delete"),
        ("/healthz", "get"),
    ]:
        assert method in doc["paths"][path]
    assert "Event" in doc["components"]["schemas"]


def test_missing_secret_key_outside_development_is_a_startup_error():
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env["APP_ENV"] = "production"
    proc = subprocess.run([sys.executable, "-c", "import app.web"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "SECRET_KEY is not set" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "app", "migrate", "--status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "SECRET_KEY is not set" in proc.stderr


def test_bad_integer_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("DB_POOL_SIZE", "lots")
    try:
        config.load()
    except config.ConfigError as exc:
        assert "DB_POOL_SIZE" in str(exc)
    else:
        raise AssertionError("expected ConfigError")


def test_create_api_key_prints_it_once_and_stores_only_a_hash(capsys):
    assert cli_main(["create-api-key", "billing", "--scope", "events"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("nk_")
    rows = [(n, s, bytes(h)) for n, s, h in db.query("SELECT name, scope, key_hash FROM api_keys")]
    assert rows == [("billing", "events", apikeys.hash_key(key))]
    assert apikeys.cache.lookup(key).scope == "events"


def test_cli_rejects_unknown_scope():
    proc = subprocess.run(
        [sys.executable, "-m", "app", "create-api-key", "x", "--scope", "root"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
