"""Commands that work in the next terminal: `make run` writes `.env` (scripts/dev/env_file.py), every
command reads it (app/platform/config.py, ENV_FILE), the environment wins over it, and the `notify`
console script (pyproject.toml [project.scripts]) runs the CLI from it without exporting anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dotenv
from honcho import environ as honcho_environ

from app.platform import apikeys, config
from scripts import demo_data
from scripts.dev import env_file

NOTIFY = Path(sys.executable).parent / "notify"
ROOT = Path(__file__).resolve().parents[2]


def _forget_after_test(monkeypatch, *names):
    """load_dotenv writes os.environ: have monkeypatch remove what it sets when the test ends."""
    for name in names:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


def test_settings_come_from_env_file_and_the_environment_wins(tmp_path, monkeypatch):
    path = tmp_path / ".env"
    path.write_text("DIGEST_MAX_ITEMS='7'\nBRAND_NAME='From the file'\nTRACKING=off\n# a comment\n")
    _forget_after_test(monkeypatch, "DIGEST_MAX_ITEMS", "BRAND_NAME", "TRACKING")
    monkeypatch.setenv("BRAND_NAME", "From the environment")
    monkeypatch.setenv("ENV_FILE", str(path))
    loaded = config.load()
    assert loaded.digest_max_items == 7 and loaded.tracking is False
    assert loaded.brand_name == "From the environment"
    assert loaded.env_file == str(path)


def test_env_file_relative_to_the_working_directory_and_empty_means_none(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("DIGEST_MAX_ITEMS=9\n")
    _forget_after_test(monkeypatch, "DIGEST_MAX_ITEMS")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENV_FILE", "")
    assert config.load().digest_max_items == config.Settings.digest_max_items
    monkeypatch.delenv("ENV_FILE")  # the default: .env here
    assert config.load().digest_max_items == 9


def test_written_values_read_back_the_same_by_dotenv_bash_and_honcho(tmp_path):
    values = {
        "MAIL_POSTAL_ADDRESS": "Demo Ltd, 1 Example Street, Lisbon",
        "DATABASE_URL": "postgresql://localhost/notify",
        "NOTIFY_ADMIN_KEY": "nk_abc-DEF_123",
    }
    path = env_file.write(values, tmp_path / ".env")
    env_file.write({"DATABASE_URL": "postgresql://localhost/other"}, path)  # replaced, others kept
    expected = {**values, "DATABASE_URL": "postgresql://localhost/other"}
    assert dotenv.dotenv_values(path) == expected
    assert honcho_environ.parse(path.read_text()) == expected
    script = ". ./.env; " + "; ".join(f'printf "%s\\n" "${name}"' for name in expected)
    shown = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert shown.stdout.splitlines() == list(expected.values())


def test_notify_console_script_runs_from_env_file_alone(tmp_path, database_url):
    """`.venv/bin/notify create-api-key NAME --scope admin` in the next terminal: nothing exported."""
    env_file.write(
        {"APP_ENV": "test", "DATABASE_URL": database_url, "REDIS_URL": config.get().redis_url}, tmp_path / ".env"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("APP_ENV", "DATABASE_URL", "REDIS_URL", "ENV_FILE")}
    done = subprocess.run(
        [str(NOTIFY), "create-api-key", "ops-newcomer", "--scope", "admin"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    principal = apikeys.KeyCache().lookup(key)
    assert principal is not None and (principal.name, principal.scope) == ("ops-newcomer", "admin")


def test_demo_keys_are_written_once_and_kept_while_they_work(tmp_path, monkeypatch):
    path = tmp_path / ".env"
    monkeypatch.setenv("ENV_FILE", str(path))
    first = demo_data.demo_keys()
    assert all(created for _, created in first.values())
    stored = dotenv.dotenv_values(path)
    assert stored["NOTIFY_ADMIN_KEY"] == first["admin"][0] and stored["NOTIFY_EVENTS_KEY"] == first["events"][0]
    assert apikeys.KeyCache().lookup(stored["NOTIFY_ADMIN_KEY"]).scope == "admin"

    again = demo_data.demo_keys()
    assert again == {scope: (key, False) for scope, (key, _) in first.items()}

    apikeys.revoke("demo-admin")  # or a new database: the key in the file no longer works
    third = demo_data.demo_keys()
    assert third["events"] == (first["events"][0], False)
    assert third["admin"][1] and third["admin"][0] != first["admin"][0]
    assert dotenv.dotenv_values(path)["NOTIFY_ADMIN_KEY"] == third["admin"][0]


def test_env_file_is_ignored_by_git():
    done = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert done.returncode == 0
