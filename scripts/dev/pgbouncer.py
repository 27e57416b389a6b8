"""Run a command with a private PgBouncer (transaction pooling) in front of Postgres.

    python -m scripts.dev.pgbouncer [--port N] [--pool-size N] -- COMMAND ARGS...

Starts Debian's `pgbouncer` (installed by `make pgbouncer`, scripts/dev/apt-install.sh) with a
configuration in a temporary directory — pool_mode = transaction, listen 127.0.0.1 on a free port
(or --port / PGBOUNCER_PORT), trust auth for the connecting user, every database forwarded to the
Postgres of TEST_DATABASE_URL — then runs COMMAND with:

    TEST_DATABASE_URL         the same database, through PgBouncer
    TEST_DIRECT_DATABASE_URL  the original URL (the tests' migrations run there)
    TEST_THROUGH_PGBOUNCER    1 (tests/conftest.py skips the `direct_db` tests and says why)

and stops PgBouncer afterwards; the exit status is the command's. `make test` runs the
integration suite once this way. Without the binary (not root, no sudo) it prints a warning and
exits 0 without running COMMAND, as the browser tests do without Chromium — except under CI (the
environment variable CI set, as CI services do): there it fails (exit 1), so a pass that never
ran cannot look green.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def find_binary() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config_text(port: int, upstream_host: str, upstream_port: int, pool_size: int, users_file: str) -> str:
    return f"""\
[databases]
; every database name is forwarded to the same Postgres (each xdist worker has its own; tests create scratch ones)
* = host={upstream_host} port={upstream_port}

[pgbouncer]
pool_mode = transaction
; hand out idle server connections oldest first (production's default is LIFO), so that consecutive
; transactions of one client land in different server sessions as often as possible: session state
; the service wrongly relied on would show up here, not only under production load
server_round_robin = 1
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {users_file}
default_pool_size = {pool_size}
max_client_conn = 1000
; a client waiting this long for a server connection gets an error instead of a hang
query_wait_timeout = 60
; the service never leaves a transaction idle across slow work (README "Running behind PgBouncer")
idle_transaction_timeout = 60
; psycopg2 sends nothing else at start-up; listed so other drivers work too
ignore_startup_parameters = extra_float_digits
"""


def start(binary: str, workdir: Path, port: int, upstream: str, pool_size: int, users: set[str]):
    parsed = urlparse(upstream)
    users_file = workdir / "users.txt"
    users_file.write_text("".join(f'"{u}" ""\n' for u in sorted(users)))
    ini = workdir / "pgbouncer.ini"
    ini.write_text(config_text(port, parsed.hostname or "127.0.0.1", parsed.port or 5432, pool_size, str(users_file)))
    command = [binary, str(ini)]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root; it reads its files before switching user.
        command += ["-u", "postgres" if _user_exists("postgres") else "nobody"]
        for path in (workdir, users_file, ini):
            path.chmod(0o755 if path.is_dir() else 0o644)
    log = open(workdir / "pgbouncer.log", "wb")  # noqa: SIM115 - the child process writes to it after we return
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, workdir / "pgbouncer.log"


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def wait_until_serving(proc, url: str, log_path: Path, timeout: float = 20.0) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"pgbouncer exited at start-up:\n{log_path.read_text(errors='replace')}")
        try:
            psycopg2.connect(url, connect_timeout=2).close()
            return
        except psycopg2.OperationalError as exc:
            last = exc
            time.sleep(0.1)
    raise SystemExit(f"pgbouncer did not answer at {url}: {last}\n{log_path.read_text(errors='replace')}")


def through(url: str, port: int) -> str:
    parsed = urlparse(url)
    auth = ""
    if parsed.username:
        auth = parsed.username + (f":{parsed.password}" if parsed.password else "") + "@"
    return urlunparse(parsed._replace(netloc=f"{auth}127.0.0.1:{port}"))


def stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # immediate shutdown: the command is done with it
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def in_ci() -> bool:
    """CI=true (or any value but empty, 0, false), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PGBOUNCER_PORT") or 0),
        help="listen port (default PGBOUNCER_PORT, else a free one)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=int(os.environ.get("PGBOUNCER_POOL_SIZE") or 20),
        help="server connections per database and user (default 20)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    binary = find_binary()
    if binary is None:
        missing = "pgbouncer is not installed (apt-get install pgbouncer, or `make pgbouncer` as root)"
        if in_ci():  # a skipped pass must not look green where nobody reads the warning
            print(f"ERROR: {missing}: CI is set, so the PgBouncer pass cannot be skipped", file=sys.stderr)
            return 1
        print(f"WARNING: {missing}: the PgBouncer pass is skipped", file=sys.stderr)
        return 0
    upstream = os.environ.get("TEST_DATABASE_URL", "postgresql://localhost/notify_test")
    port = args.port or free_port()
    users = {getpass.getuser()}
    if urlparse(upstream).username:
        users.add(urlparse(upstream).username)
    # A database PgBouncer once failed to log in to is retried only after server_login_retry (15 s):
    # make sure it exists before anything connects through PgBouncer.
    from app.platform.migrate import ensure_database

    ensure_database(upstream)
    workdir = Path(tempfile.mkdtemp(prefix="notify-pgbouncer-"))
    proc, log_path = start(binary, workdir, port, upstream, args.pool_size, users)
    try:
        pooled = through(upstream, port)
        wait_until_serving(proc, pooled, log_path)
        print(
            f"pgbouncer: transaction pooling on 127.0.0.1:{port} (pool size {args.pool_size}) "
            f"in front of {urlparse(upstream).hostname}:{urlparse(upstream).port or 5432}",
            flush=True,
        )
        env = {
            **os.environ,
            "TEST_DATABASE_URL": pooled,
            "TEST_DIRECT_DATABASE_URL": upstream,
            "TEST_THROUGH_PGBOUNCER": "1",
        }
        try:
            status = subprocess.call(command, env=env)
        except KeyboardInterrupt:
            return 130
        if status != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-40:]
            print("pgbouncer: the command failed; the end of PgBouncer's log:\n  " + "\n  ".join(tail), file=sys.stderr)
        return status
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
