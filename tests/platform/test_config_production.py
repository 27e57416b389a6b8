"""Secure by default: outside development/test no built-in key, no unsigned webhook without an
explicit opt-out, no mail viewer; and APP_ENV unset means production."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.platform import config

GOOD_KEY = "k" * 48
PRODUCTION_VARS = (
    "APP_ENV",
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "SENDGRID_WEBHOOK_PUBLIC_KEY",
    "SENDGRID_WEBHOOK_ALLOW_UNSIGNED",
    "MAIL_POSTAL_ADDRESS",
)


@pytest.fixture
def prod(monkeypatch):
    """A production environment that loads: long key, explicit unsigned-webhook opt-out, postal address."""
    for name in PRODUCTION_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APP_ENV", "production")
    monkeypatch.setenv("SECRET_KEY", GOOD_KEY)
    monkeypatch.setenv("SENDGRID_WEBHOOK_ALLOW_UNSIGNED", config.ALLOW_UNSIGNED_WEBHOOK)
    monkeypatch.setenv("MAIL_POSTAL_ADDRESS", "Example Ltd, 1 Main St, Springfield")
    return monkeypatch


def refused(match: str) -> str:
    with pytest.raises(config.ConfigError, match=match) as exc:
        config.load()
    return str(exc.value)


def test_unset_app_env_means_production(prod):
    prod.delenv("APP_ENV")
    assert config.load().env == "production" and not config.load().is_development
    prod.delenv("SECRET_KEY")
    assert "APP_ENV=development" in refused("SECRET_KEY is not set")  # says what to set


@pytest.mark.parametrize("env", ["production", "staging", "", "  "])
def test_every_non_development_env_refuses_a_missing_key(prod, env):
    prod.setenv("APP_ENV", env)
    prod.delenv("SECRET_KEY")
    refused("SECRET_KEY is not set")


def test_production_refuses_the_repository_key_even_as_a_fallback(prod):
    prod.setenv("SECRET_KEY", config.DEV_SECRET_KEY)
    refused("development key")
    prod.setenv("SECRET_KEY", GOOD_KEY)
    prod.setenv("SECRET_KEY_FALLBACKS", f"old-key-that-was-long-enough-000000, {config.DEV_SECRET_KEY}")
    refused("development key")


def test_production_refuses_a_short_key(prod):
    prod.setenv("SECRET_KEY", "x" * (config.MIN_SECRET_KEY_LENGTH - 1))
    assert "openssl rand" in refused("at least 32")
    prod.setenv("SECRET_KEY", "x" * config.MIN_SECRET_KEY_LENGTH)
    assert config.load().secret_keys == ("x" * 32,)


def test_production_keys_are_the_configured_ones(prod):
    prod.setenv("SECRET_KEY_FALLBACKS", "short-old-key")  # an old key still verifies after rotation
    assert config.load().secret_keys == (GOOD_KEY, "short-old-key")


def test_development_and_test_still_get_the_built_in_key(prod):
    prod.delenv("SECRET_KEY")
    prod.delenv("SENDGRID_WEBHOOK_ALLOW_UNSIGNED")
    for env in ("development", "test"):
        prod.setenv("APP_ENV", env)
        settings = config.load()
        assert settings.secret_key == config.DEV_SECRET_KEY and settings.is_development


def test_production_refuses_an_unsigned_webhook_without_the_opt_out(prod):
    prod.delenv("SENDGRID_WEBHOOK_ALLOW_UNSIGNED")
    message = refused("SENDGRID_WEBHOOK_PUBLIC_KEY is not set")
    assert f"SENDGRID_WEBHOOK_ALLOW_UNSIGNED={config.ALLOW_UNSIGNED_WEBHOOK}" in message
    prod.setenv("SENDGRID_WEBHOOK_PUBLIC_KEY", "MFkw...")  # parsed (and refused if bad) at web start-up
    assert not config.load().sendgrid_webhook_allow_unsigned


@pytest.mark.parametrize("value", ["1", "true", "yes", "I-UNDERSTAND"])
def test_the_opt_out_takes_only_its_exact_phrase(prod, value):
    prod.setenv("SENDGRID_WEBHOOK_ALLOW_UNSIGNED", value)
    refused("must be exactly 'i-understand-anyone-can-post-events'")


def test_the_opt_out_loads(prod):
    settings = config.load()
    assert settings.sendgrid_webhook_allow_unsigned and settings.sendgrid_webhook_public_key == ""


def test_production_app_mounts_no_mail_viewer_and_warns_about_unsigned_webhooks(settings, caplog):
    from app import web

    settings(env="production", secret_key=GOOD_KEY, sendgrid_webhook_allow_unsigned=True)
    app = web.create_app()
    paths = [route.path for route in app.routes]
    assert "/webhooks/sendgrid" in paths and not any(p.startswith("/dev") for p in paths)
    assert any(r.levelname == "WARNING" and "UNSIGNED" in r.getMessage() for r in caplog.records)


def test_no_environment_mounts_the_mail_viewer_in_the_web_app():
    """It is a development process of its own (scripts/dev/mailviewer.py), outside the package."""
    from app import web

    assert not any(route.path.startswith("/dev") for route in web.create_app().routes)


def test_a_malformed_webhook_key_is_a_start_up_error(settings):
    from app import web

    settings(env="production", secret_key=GOOD_KEY, sendgrid_webhook_public_key="bm90IGEga2V5")
    with pytest.raises(config.ConfigError, match="SENDGRID_WEBHOOK_PUBLIC_KEY"):
        web.create_app()


def _production_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARS}
    return {**env, "APP_ENV": "production", **extra}


def test_the_web_process_refuses_to_start_with_an_unsigned_webhook():
    proc = subprocess.run(
        [sys.executable, "-c", "import app.web"],
        env=_production_env(SECRET_KEY=GOOD_KEY),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "SENDGRID_WEBHOOK_PUBLIC_KEY is not set" in proc.stderr
    assert f"SENDGRID_WEBHOOK_ALLOW_UNSIGNED={config.ALLOW_UNSIGNED_WEBHOOK}" in proc.stderr


def test_a_process_started_without_app_env_refuses_the_built_in_key():
    env = _production_env()
    del env["APP_ENV"]  # a Procfile deploy that forgot it
    for cmd in (["-c", "import app.web"], ["-m", "app", "list-api-keys"]):
        proc = subprocess.run([sys.executable, *cmd], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "SECRET_KEY is not set" in proc.stderr, proc.stderr
