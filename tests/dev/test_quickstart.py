"""The README's quick start works by copy-paste: every ```sh block of it runs, in order, in one bash
session, against real processes — the web app under uvicorn, a Dramatiq worker and the development
mail sink + viewer, each on a free port — and the digest, the test send and the newsletter it
promises show up in the viewer.

What the test changes, and only that: the block marked `<!-- quickstart: skip -->` (`make run`: the
test starts the processes itself) is not run; `http://127.0.0.1:8000` and `http://127.0.0.1:8025`
become the test's ports; the working directory is a scratch copy of a checkout (`.venv` linked,
`.env` written as `make run` writes it, with demo keys from scripts/demo_data.py) and the shell
starts with nothing exported but PATH and HOME, as a new terminal would.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.platform import config
from scripts import demo_data
from scripts.dev import env_file
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WEB, VIEWER = "http://127.0.0.1:8000", "http://127.0.0.1:8025"
_BLOCK = re.compile(r"(?:<!-- quickstart: (?P<mark>[a-z]+)[^>]*-->\n)?```sh\n(?P<body>.*?)```", re.S)


def quickstart_blocks() -> list[tuple[str | None, str]]:
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [(m["mark"], m["body"]) for m in _BLOCK.finditer(section)]


def test_quick_start_is_short_and_first():
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Quick start", headings
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert len(section.splitlines()) <= 65
    assert len(text.splitlines()) <= 250
    marks = [mark for mark, _ in quickstart_blocks()]
    assert marks.count("skip") == 1 and "make run" in quickstart_blocks()[marks.index("skip")][1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class _Exited(RuntimeError):
    """A process ended while starting: most likely a port taken between the probe and the bind."""


def _launch(logs: Path) -> tuple[dict, dict]:
    settings = config.get()
    web_port, sink_port, viewer_port = _free_port(), _free_port(), _free_port()
    web, viewer = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{viewer_port}"
    mail_dir = logs / "mail"
    env = {
        **os.environ,
        "APP_ENV": "test",
        "ENV_FILE": "",
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "MAIL_PROVIDER": "smtp",
        "SMTP_URL": f"smtp://127.0.0.1:{sink_port}",
        "MAIL_FILE_DIR": str(mail_dir),
        "BASE_URL": web,
        "MAIL_VIEWER_URL": f"{viewer}/dev/mail",
        "LOG_LEVEL": "WARNING",
    }
    commands = {
        "viewer": ["-m", "scripts.dev.mailviewer", "--port", str(sink_port), "--web-port", str(viewer_port)],
        "web": ["-m", "uvicorn", "app.web:app", "--host", "127.0.0.1", "--port", str(web_port), "--no-access-log"],
        "worker": ["-m", "dramatiq", "actors", "--processes", "1", "--threads", "2"],
    }
    logs.mkdir(parents=True)
    procs = {}
    for name, args in commands.items():
        with (logs / f"{name}.log").open("wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )
    return procs, {"web": web, "viewer": viewer, "mail_dir": mail_dir, "env": env, "logs": logs}


def _ready(procs: dict, info: dict) -> bool:
    for name, proc in procs.items():
        if proc.poll() is not None:
            raise _Exited(
                f"{name} exited with {proc.returncode}: {(info['logs'] / (name + '.log')).read_text()[-2000:]}"
            )
    return _answers(f"{info['web']}/healthz") and _answers(f"{info['viewer']}/dev/mail")


@pytest.fixture
def instance(tmp_path, redis_client):
    """web + worker + mail sink/viewer as real processes; yields their URLs, environment and logs."""
    for attempt in range(3):
        procs, info = _launch(tmp_path / f"instance-{attempt}")
        try:
            wait_for(lambda: _ready(procs, info), timeout=60, what=f"web and viewer to answer (logs: {info['logs']})")
        except BaseException as exc:
            for proc in procs.values():
                _stop(proc)
            if isinstance(exc, _Exited) and attempt < 2:
                continue  # new ports
            raise
        try:
            yield info
        finally:
            for proc in procs.values():
                _stop(proc)
        return


def _terminal(tmp_path: Path, instance: dict) -> tuple[Path, dict]:
    """A scratch checkout to type in: `.venv` linked, `.env` as `make run` leaves it; a bare environment."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.executable).parent.parent)
    target = checkout / ".env"
    env = instance["env"]
    env_file.write(
        {name: env[name] for name in ("APP_ENV", "DATABASE_URL", "REDIS_URL", "MAIL_PROVIDER", "SMTP_URL")}, target
    )
    env_file.write({"MAIL_FILE_DIR": str(instance["mail_dir"])}, target)
    previous = os.environ.get("ENV_FILE")
    os.environ["ENV_FILE"] = str(target)
    try:
        demo_data.demo_keys()  # NOTIFY_ADMIN_KEY, NOTIFY_EVENTS_KEY, as `make run` writes them
    finally:
        os.environ["ENV_FILE"] = previous if previous is not None else ""
    shell_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return checkout, shell_env


def _viewer_rows(viewer: str) -> list[tuple[str, str]]:
    page = httpx.get(f"{viewer}/dev/mail", timeout=5).text
    return re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td><td><a [^>]*>([^<]*)</a></td></tr>", page)


def test_every_quick_start_block_runs_and_the_mails_arrive(tmp_path, instance):
    checkout, shell_env = _terminal(tmp_path, instance)
    script, ran = ["set -eo pipefail"], []
    for number, (mark, body) in enumerate(quickstart_blocks(), 1):
        if mark == "skip":
            continue
        body = body.replace(WEB, instance["web"]).replace(VIEWER, instance["viewer"])
        script += [f"echo '>>> block {number}'", body, f"printf '\\n<<< block %s ok\\n' {number}"]
        ran.append(number)
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=checkout, env=shell_env, capture_output=True, text=True, timeout=300
    )
    finished = [int(n) for n in re.findall(r"^<<< block (\d+) ok$", done.stdout, re.M)]
    assert done.returncode == 0 and finished == ran, (
        f"quick start block {next((n for n in ran if n not in finished), '?')} failed "
        f"(exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )

    name = "Sam"  # the PATCH block renamed the subscriber (not "Ana": the demo has an Ana Lima)

    def arrived():
        rows = _viewer_rows(instance["viewer"])
        mine = [subject for to, subject in rows if "you@example.test" in to]
        newsletter = f"News for {name}"
        return (
            any(s != newsletter for s in mine)  # the digest (its wording is the digest's business)
            and newsletter in mine
            # The test recipient has no name: the subject's section leaves "for …" out.
            and any(s == "[Test] News" for to, s in rows if "editor@example.test" in to)
        )

    wait_for(arrived, timeout=90, what=f"the quick start's mails in the viewer (logs in {instance['logs']})")
    # Subjects read as a person writes them: no word left hanging where a value was empty.
    hanging = [s for _, s in _viewer_rows(instance["viewer"]) if re.search(r"(\s|\b(for|to|of|and|from|,))$", s)]
    assert not hanging, f"subjects that end mid-sentence: {hanging}"
    # One base URL: every link and picture in the quick start's mails points at the web process.
    links = [
        url
        for eml in instance["mail_dir"].rglob("*.eml")
        for part in email.message_from_bytes(eml.read_bytes(), policy=email.policy.default).walk()
        if part.get_content_type() in ("text/html", "text/plain")
        for url in re.findall(r"https?://[^\s\"'<>)]+", part.get_content())
    ]
    assert links and all(url.startswith(instance["web"] + "/") for url in links), sorted(set(links))[:20]
