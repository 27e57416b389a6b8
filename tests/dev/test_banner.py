"""One base URL in development: what `make run` exports and writes to `.env` (BASE_URL, the mail
viewer's and the feed demo's addresses) names the host and port the web process binds in
Procfile.dev; the settings' own defaults are the same addresses (a process started without make
agrees); the banner prints what the processes read. The quick-start test checks the mails' links
against BASE_URL (tests/dev/test_quickstart.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from app.platform import config
from scripts.dev import env_file

ROOT = Path(__file__).resolve().parents[2]
URLS = ("BASE_URL", "MAIL_VIEWER_URL", "FEED_DEMO_URL", "FEED_ALLOWED_ORIGINS")


def run_exports() -> dict[str, str]:
    """`run: export NAME ?= value` of the Makefile, $(NAME) references resolved."""
    values: dict[str, str] = {}
    for name, value in re.findall(r"^run: export (\w+) \?= (.*)$", (ROOT / "Makefile").read_text(), re.M):
        values[name] = re.sub(r"\$\((\w+)\)", lambda m: values[m[1]], value.strip())
    return values


def test_make_run_writes_one_host_for_web_viewer_and_feed_demo():
    exports = run_exports()
    written = re.search(r"^DEV_SETTINGS = (.*)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    assert set(URLS) <= set(written) and set(URLS) <= set(exports)
    web = re.search(r"^web: .*--host (\S+) --port \$\{DEV_PORT:-(\d+)\}", (ROOT / "Procfile.dev").read_text(), re.M)
    assert urlsplit(exports["BASE_URL"]).netloc == f"{web[1]}:{exports['DEV_PORT']}"
    assert exports["DEV_PORT"] == web[2]
    assert {urlsplit(exports[name]).hostname for name in URLS} == {web[1]}
    defaults = config.Settings()
    assert defaults.base_url == exports["BASE_URL"]
    assert defaults.mail_viewer_url == exports["MAIL_VIEWER_URL"]
    assert defaults.feed_demo_url == exports["FEED_DEMO_URL"]


def test_the_banner_prints_the_addresses_the_processes_read(tmp_path):
    target = tmp_path / ".env"
    env_file.write(
        {
            "APP_ENV": "development",
            "BASE_URL": "http://127.0.0.1:8123",
            "MAIL_VIEWER_URL": "http://127.0.0.1:8125/dev/mail",
            "FEED_DEMO_URL": "http://127.0.0.1:8126/?user=demo-ana",
        },
        target,
    )
    env = {k: v for k, v in os.environ.items() if k not in (*URLS, "APP_ENV")} | {"ENV_FILE": str(target)}
    out = subprocess.run(
        [sys.executable, "-m", "scripts.dev.banner"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "web: http://127.0.0.1:8123 " in out and "http://127.0.0.1:8123/admin" in out
    assert "http://127.0.0.1:8123/docs" in out
    assert "mail viewer: http://127.0.0.1:8125/dev/mail" in out and "http://127.0.0.1:8126/?user=demo-ana" in out
    assert "localhost" not in out
