"""The migration runner (app/platform/migrate.py) against yoyo-migrations, the library a user would reach for
to apply plain .sql files, both on the same Postgres in the same run.

    .venv/bin/python scripts/bench/migrations.py [--hold 10] [--repeat 5]

yoyo reads a temporary copy of sql/migrations: the same files, with `-- transactional: false`
prepended to the files marked `-- migrate: no-transaction` (without it yoyo wraps CREATE INDEX
CONCURRENTLY in a transaction, which Postgres refuses), CONCURRENTLY left out of an index on a
partitioned table (Postgres refuses it there; our runner builds it partition by partition), and the
`-- migrate: python` file written as a yoyo Python migration calling the same function. That is the
whole conversion. Measured:
  (a) the full set on an empty database, in process (median of --repeat, fresh database each)
  (b) the no-op run (everything applied: what every release pays), in process and as the CLI an
      operator runs (`python -m app migrate` / `yoyo apply --batch`), process start included; our
      CLI imports every command module (dramatiq, redis, ...), so a process importing only
      app.platform.migrate is shown too
  (c) 0004-0420 pending while a transaction holds subscribers open for --hold seconds and a writer
      keeps updating subscribers: when the migration finished, and how long the writer was stalled
      behind the migrator's queued ACCESS EXCLUSIVE request (ours at the shipped 200ms lock_timeout
      and at 5s; yoyo as shipped and with lock_timeout set through the URL, its only knob)
  (d) two migrator processes started at once on an empty database
  (e) a migrator killed (SIGKILL, e.g. a deploy timeout) while waiting for that lock, then rerun
  (f) a CREATE UNIQUE INDEX CONCURRENTLY that failed on duplicates, data fixed, run again
Databases notify_bench_migrate_* on postgresql://localhost, created and dropped here.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import psycopg2  # noqa: E402
from yoyo import get_backend, read_migrations  # noqa: E402

from app.platform import config, migrate, partitions  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
BASE = "postgresql://localhost"
PREFIX = "notify_bench_migrate_"
YOYO_NO_TX = "-- transactional: false\n"
HEAD = ("0001", "0002", "0003")  # applied before (c) and (e); 0004 alters subscribers
BENCH = "migration runner"
YOYO = "yoyo-migrations"


class _Retries(logging.Handler):
    """Counts our runner's 'lock not granted' warnings (one per lock timeout)."""

    count = 0

    def emit(self, record):
        if "lock not granted" in record.getMessage():
            _Retries.count += 1


_log = logging.getLogger("app.platform.migrate")
_log.addHandler(_Retries())
_log.propagate = False


# -- databases and migration folders -------------------------------------------------------------


def admin(sql: str) -> None:
    conn = psycopg2.connect(f"{BASE}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


def fresh(suffix: str) -> str:
    name = PREFIX + suffix
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}"')
    return f"{BASE}/{name}"


def drop_all(names: set[str]) -> None:
    for name in names:
        admin(f'DROP DATABASE IF EXISTS "{PREFIX + name}" WITH (FORCE)')


def one(url: str, sql: str):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
        row = cur.fetchone() if cur.description else None
    conn.close()
    return row


# A `-- migrate: python module:function` file (nothing but comments) as yoyo's own kind: a Python
# migration, outside a transaction, calling the same function with yoyo's connection.
YOYO_PYTHON_STEP = """from importlib import import_module

from yoyo import step

__transactional__ = False


def apply(conn):
    conn.autocommit = True
    getattr(import_module({module!r}), {function!r})(conn)


steps = [step(apply)]
"""


PARTITIONED_FROM = "0525"  # the event tables are partitioned from here on
PARTITIONED_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s[^;]*?\sON\s+(?:ONLY\s+)?(?:"
    + "|".join(t.name for t in partitions.TABLES)
    + r")\s",
    re.IGNORECASE,
)


def folder(dest: Path, files: dict[str, str], for_yoyo: bool) -> tuple[Path, int]:
    """Write migration files into dest; for yoyo, mark the no-transaction ones and turn the Python
    steps into Python migrations, its ways."""
    dest.mkdir(parents=True)
    converted = 0
    for name, sql in files.items():
        head = "\n".join(sql.splitlines()[:5])
        python_step = migrate.PYTHON_STEP_MARK.search(head)
        if for_yoyo and python_step:
            module, _, function = python_step.group("target").partition(":")
            name, sql = name[: -len(".sql")] + ".py", YOYO_PYTHON_STEP.format(module=module, function=function)
            converted += 1
        elif for_yoyo and migrate.NO_TX_MARK.search(head):
            sql = YOYO_NO_TX + sql
            if name[:4] > PARTITIONED_FROM:
                # Postgres refuses CONCURRENTLY on a partitioned table; a yoyo user writes the plain
                # statement (writes wait for the build) or the steps by hand (app/platform/partitioned_index.py).
                sql = PARTITIONED_CONCURRENT_INDEX.sub(lambda m: m.group(0).replace(" CONCURRENTLY", ""), sql)
            converted += 1
        (dest / name).write_text(sql)
    return dest, converted


@contextmanager
def ours_reading(directory: Path):
    real = migrate.discover
    migrate.discover = lambda directory=directory: real(directory)
    try:
        yield
    finally:
        migrate.discover = real


@contextmanager
def ours_lock_timeout(value: str):
    previous = config.override(migration_lock_timeout=value)
    try:
        yield
    finally:
        config.override(migration_lock_timeout=previous.migration_lock_timeout)


def run_ours(url: str, directory: Path) -> None:
    with ours_reading(directory):
        migrate.migrate(url, create_db=False)


def run_yoyo(url: str, directory: Path) -> None:
    """What `yoyo apply --batch` does (yoyo/scripts/migrate.py apply), in process."""
    backend = get_backend(url)
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(str(directory))))
    finally:
        backend.connection.close()


def cli(tool: str, url: str, directory: Path) -> list[str]:
    if tool == "ours":
        return [sys.executable, "-m", "app", "migrate"]
    return [sys.executable, "-m", "yoyo", "apply", "--batch", "--no-config-file", "-d", url, str(directory)]


def cli_env(url: str) -> dict:
    return {
        **os.environ,
        "APP_ENV": "development",
        "DATABASE_URL": url,
        "MIGRATION_DATABASE_URL": url,
        "LOG_LEVEL": "WARNING",
    }


def applied_count(tool: str, url: str) -> int:
    table = "schema_migrations" if tool == "ours" else "_yoyo_migration"
    return one(url, f"SELECT count(*) FROM {table}")[0]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


# -- (c) a long transaction holds the table the next migration alters ------------------------------


def lock_wait(url: str, apply, hold: float) -> dict:
    """Hold subscribers open for `hold` s, keep a writer updating it, run `apply`; report."""
    one(url, "INSERT INTO subscribers (user_id, email) VALUES ('bench', 'b@example.com')")
    long_tx = psycopg2.connect(url)
    with long_tx.cursor() as cur:
        cur.execute("SELECT count(*) FROM subscribers")  # ACCESS SHARE until commit
    stop = threading.Event()
    writes: list[tuple[float, float]] = []

    def writer():
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not stop.is_set():
                started = time.perf_counter()
                cur.execute("UPDATE subscribers SET updated_at = now() WHERE user_id = 'bench'")
                writes.append((started, time.perf_counter() - started))
                time.sleep(0.005)
        conn.close()

    result: dict = {}

    def migrator():
        try:
            apply()
            result["outcome"] = "applied"
        except Exception as exc:  # reported in the table
            result["outcome"] = f"failed: {type(exc).__name__}"
        result["done"] = time.perf_counter() - t0

    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.3)
    _Retries.count = 0
    t0 = time.perf_counter()
    release = threading.Timer(hold, long_tx.commit)
    release.start()
    m = threading.Thread(target=migrator)
    m.start()
    m.join()
    release.join()
    time.sleep(0.2)
    stop.set()
    w.join()
    long_tx.close()
    window = [lat for started, lat in writes if started >= t0 - 0.01]
    result["stall"] = max(window)
    result["blocked"] = sum(lat for lat in window if lat > 0.05)
    result["retries"] = _Retries.count
    return result


def record_held(held: dict, hold: float) -> None:
    """(c) for BENCHMARKS.md: ours beside yoyo at the same lock_timeout (5s), and each as shipped."""
    pairs = (
        ("ours, lock_timeout 5s", "yoyo, ?options=-c lock_timeout=5s", "lock_timeout 5s"),
        ("ours, lock_timeout 200ms (shipped)", "yoyo (no lock_timeout)", "lock_timeout 200ms (shipped)"),
    )
    for ours_key, yoyo_key, which in pairs:
        o, y = held[ours_key], held[yoyo_key]
        details = {"hold_s": hold, "outcome": o["outcome"], "baseline_outcome": y["outcome"]}
        for figure, key in (
            ("migration done after", "done"),
            ("writer's longest stall", "stall"),
            ("writer blocked in total", "blocked"),
        ):
            record(
                f"{BENCH}, 0004+ pending behind a transaction holding subscribers",
                f"{figure}, ours {which}",
                o[key],
                "s",
                baseline=y[key],
                baseline_label=yoyo_key,
                higher_is_better=False,
                **details,
            )


# -- (e) a migrator killed while it waits, then started again ---------------------------------------


def killed_then_rerun(tool: str, url: str, directory: Path) -> tuple[int, float, str]:
    long_tx = psycopg2.connect(url)
    with long_tx.cursor() as cur:
        cur.execute("SELECT count(*) FROM subscribers")
    victim = subprocess.Popen(
        cli(tool, url, directory), env=cli_env(url), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(1.5)  # started, waiting for the lock on subscribers
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    long_tx.commit()  # the long transaction ends right after the kill
    long_tx.close()
    started = time.perf_counter()
    rerun = subprocess.run(
        cli(tool, url, directory), env=cli_env(url), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    elapsed = time.perf_counter() - started
    lines = (rerun.stderr.strip() or rerun.stdout.strip()).splitlines()
    return rerun.returncode, elapsed, lines[-1] if lines else ""


# -- (f) a concurrent unique index build that failed ------------------------------------------------

INDEX_FILES = {
    "0001_t.sql": "CREATE TABLE t (id int PRIMARY KEY, v int);\nINSERT INTO t VALUES (1, 7), (2, 7);\n",
    "0002_t_v_idx.sql": "-- migrate: no-transaction\n"
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_v_idx ON t (v);\n",
}


def failed_index_then_rerun(apply, url: str, tool: str) -> str:
    try:
        apply()
    except Exception:
        pass
    else:
        return "first run did not fail?"
    one(url, "UPDATE t SET v = 8 WHERE id = 2")  # the operator fixes the data
    try:
        apply()
    except Exception as exc:
        return f"rerun failed: {type(exc).__name__}"
    valid = one(url, "SELECT indisvalid FROM pg_index WHERE indexrelid = 't_v_idx'::regclass")[0]
    recorded = applied_count(tool, url)
    return f"rerun ok, 0002 recorded applied ({recorded}/2), " + (
        "index valid, unique enforced" if valid else "index INVALID: unique NOT enforced"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hold", type=float, default=10.0, help="seconds the long transaction holds subscribers")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    logging.getLogger("yoyo").setLevel(logging.ERROR)
    used: set[str] = set()

    def db(suffix: str) -> str:
        used.add(suffix)
        return fresh(suffix)

    files = {m.path.name: m.sql for m in migrate.discover()}
    head = {n: s for n, s in files.items() if n[:4] in HEAD}
    tmp = Path(tempfile.mkdtemp(prefix="bench_migrations_"))
    try:
        dirs = {
            "ours": folder(tmp / "ours", files, False)[0],
            "ours_head": folder(tmp / "ours_head", head, False)[0],
            "ours_idx": folder(tmp / "ours_idx", INDEX_FILES, False)[0],
        }
        dirs["yoyo"], converted = folder(tmp / "yoyo", files, True)
        dirs["yoyo_head"] = folder(tmp / "yoyo_head", head, True)[0]
        dirs["yoyo_idx"] = folder(tmp / "yoyo_idx", INDEX_FILES, True)[0]
        runners = {"ours": run_ours, "yoyo": run_yoyo}
        pg = one(f"{BASE}/postgres", "SHOW server_version")[0]
        print(
            f"migrations: app/platform/migrate.py vs yoyo-migrations {version('yoyo-migrations')}, PostgreSQL {pg}, "
            f"{os.cpu_count()} CPUs; {len(files)} files in sql/migrations"
        )
        print(
            f"  conversion for yoyo: {converted} of {len(files)} files (`{YOYO_NO_TX.strip()}` prepended to "
            f"the no-transaction ones, CONCURRENTLY left out on partitioned tables, the Python step as a yoyo "
            f"Python migration); ours reads them unchanged"
        )

        # (a) full set on an empty database; (b) no-op run, in process and as the CLI
        full = {"ours": [], "yoyo": []}
        noop = {"ours": [], "yoyo": []}
        noop_cli = {"ours": [], "yoyo": []}
        noop_runner = []
        for _ in range(args.repeat):
            for tool in ("ours", "yoyo"):
                url = db(f"{tool}_a")
                started = time.perf_counter()
                runners[tool](url, dirs[tool])
                full[tool].append(time.perf_counter() - started)
                assert applied_count(tool, url) == len(files)
        for _ in range(4 * args.repeat):
            for tool in ("ours", "yoyo"):
                url = f"{BASE}/{PREFIX}{tool}_a"
                started = time.perf_counter()
                runners[tool](url, dirs[tool])
                noop[tool].append(time.perf_counter() - started)
        for _ in range(args.repeat):
            for tool in ("ours", "yoyo"):
                url = f"{BASE}/{PREFIX}{tool}_a"
                started = time.perf_counter()
                subprocess.run(cli(tool, url, dirs[tool]), env=cli_env(url), cwd=ROOT, check=True, capture_output=True)
                noop_cli[tool].append(time.perf_counter() - started)
            url = f"{BASE}/{PREFIX}ours_a"
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", "from app.platform import migrate; migrate.migrate()"],
                env=cli_env(url),
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            noop_runner.append(time.perf_counter() - started)
        med = statistics.median
        print(f"\n  {'':<52} {'ours':>10} {'yoyo':>10}")
        print(
            f"  {'(a) full set on an empty database, in process':<52} {ms(med(full['ours'])):>10} "
            f"{ms(med(full['yoyo'])):>10}"
        )
        print(f"  {'(b) no-op run, in process':<52} {ms(med(noop['ours'])):>10} {ms(med(noop['yoyo'])):>10}")
        print(
            f"  {'(b) no-op run, CLI process (start-up included)':<52} {ms(med(noop_cli['ours'])):>10} "
            f"{ms(med(noop_cli['yoyo'])):>10}"
        )
        print(
            f"  {'(b) no-op run, process importing only the runner':<52} {ms(med(noop_runner)):>10} "
            f"{ms(med(noop_cli['yoyo'])):>10}"
        )
        sizes = {"files": len(files), "repeat": args.repeat}
        for figure, ours_s, yoyo_s, label in (
            ("full set on an empty database, in process (median)", full["ours"], full["yoyo"], YOYO),
            ("no-op run, in process (median)", noop["ours"], noop["yoyo"], YOYO),
            (
                "no-op run, CLI process, start-up included (median)",
                noop_cli["ours"],
                noop_cli["yoyo"],
                f"{YOYO} (`yoyo apply --batch`)",
            ),
            (
                "no-op run, process importing only the runner (median)",
                noop_runner,
                noop_cli["yoyo"],
                f"{YOYO} (`yoyo apply --batch`)",
            ),
        ):
            record(
                BENCH,
                figure,
                med(ours_s) * 1000,
                "ms",
                baseline=med(yoyo_s) * 1000,
                baseline_label=label,
                higher_is_better=False,
                **sizes,
            )

        # (c) a long transaction holds subscribers while 0004-0420 are pending
        print(
            f"\n  (c) 0004-0420 pending, a transaction holds subscribers for {args.hold:.0f} s, "
            "a writer updates subscribers meanwhile"
        )
        print(f"  {'runner':<34} {'outcome':<40} {'done at':>8} {'longest stall':>14} {'writer blocked':>15}")
        variants = [
            ("ours, lock_timeout 5s", "ours", "5s", ""),
            ("ours, lock_timeout 200ms (shipped)", "ours", "200ms", ""),
            ("yoyo (no lock_timeout)", "yoyo", None, ""),
            ("yoyo, ?options=-c lock_timeout=5s", "yoyo", None, "?options=-c%20lock_timeout%3D5s"),
        ]
        held = {}
        for k, (label, tool, timeout, query) in enumerate(variants):
            url = db(f"{tool}_c{k}")
            runners[tool](url, dirs[f"{tool}_head"])
            if tool == "ours":
                with ours_lock_timeout(timeout):
                    r = lock_wait(url, lambda: run_ours(url, dirs["ours"]), args.hold)
                outcome = r["outcome"] + (f", {r['retries']} retries" if r["retries"] else "")
            else:
                r = lock_wait(url, lambda: run_yoyo(url + query, dirs["yoyo"]), args.hold)
                outcome = r["outcome"] + (", rerun needed" if r["outcome"] != "applied" else "")
            print(f"  {label:<34} {outcome:<40} {r['done']:>6.1f} s {r['stall']:>12.2f} s {r['blocked']:>13.1f} s")
            held[label] = {**r, "outcome": outcome}
        record_held(held, args.hold)

        # (d) two migrators at once; (e) killed while waiting, then rerun; (f) failed concurrent index
        print("\n  (d) two migrator processes (the CLIs) started at once on an empty database")
        both = {}
        for tool in ("ours", "yoyo"):
            url = db(f"{tool}_d")
            started = time.perf_counter()
            procs = [
                subprocess.Popen(
                    cli(tool, url, dirs[tool]),
                    env=cli_env(url),
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            outs = [proc.communicate(timeout=120) for proc in procs]
            elapsed = time.perf_counter() - started
            rcs = [proc.returncode for proc in procs]
            errors = [(err.strip().splitlines() or [""])[-1] for (_, err), rc in zip(outs, rcs) if rc]
            recorded = applied_count(tool, url)
            print(
                f"  {tool:<5} exit codes {rcs}, {recorded}/{len(files)} recorded once each, "
                f"{elapsed:.2f} s" + (f"; {errors[0][:90]}" if errors else "")
            )
            both[tool] = {
                "seconds": elapsed,
                "exit_codes": rcs,
                "recorded": f"{recorded}/{len(files)}",
                "error": errors[0][:200] if errors else "",
            }
        record(
            BENCH,
            "two migrator CLIs at once on an empty database, until both exit",
            both["ours"]["seconds"],
            "s",
            baseline=both["yoyo"]["seconds"],
            baseline_label=YOYO,
            higher_is_better=False,
            **{f"{k}_{tool}": v for tool, r in both.items() for k, v in r.items() if k != "seconds"},
        )

        print("\n  (e) migrator SIGKILLed while waiting for the lock on subscribers, then started again")
        rerun = {}
        for tool in ("ours", "yoyo"):
            url = db(f"{tool}_e")
            runners[tool](url, dirs[f"{tool}_head"])
            rc, elapsed, last = killed_then_rerun(tool, url, dirs[tool])
            state = f"{applied_count(tool, url)}/{len(files)} applied"
            print(f"  {tool:<5} rerun exit {rc} after {elapsed:.1f} s, {state}" + (f"; {last[:100]}" if rc else ""))
            rerun[tool] = {
                "done": float(rc == 0 and applied_count(tool, url) == len(files)),
                "seconds": round(elapsed, 2),
                "exit_code": rc,
                "state": state,
                "error": last[:200] if rc else "",
            }
        record(
            BENCH,
            "rerun after a SIGKILL while waiting for a lock applies everything (1 = yes)",
            rerun["ours"]["done"],
            "yes/no",
            baseline=rerun["yoyo"]["done"],
            baseline_label=YOYO,
            **{f"{k}_{tool}": v for tool, r in rerun.items() for k, v in r.items() if k != "done"},
        )

        print("\n  (f) CREATE UNIQUE INDEX CONCURRENTLY failed on duplicates, data fixed, run again")
        fixed = {}
        for tool in ("ours", "yoyo"):
            url = db(f"{tool}_f")
            fixed[tool] = failed_index_then_rerun(lambda: runners[tool](url, dirs[f"{tool}_idx"]), url, tool)
            print(f"  {tool:<5} " + fixed[tool])
        enforced = {tool: float(text.endswith("unique enforced")) for tool, text in fixed.items()}
        record(
            BENCH,
            "failed CREATE UNIQUE INDEX CONCURRENTLY, data fixed, rerun: unique enforced (1 = yes)",
            enforced["ours"],
            "yes/no",
            baseline=enforced["yoyo"],
            baseline_label=YOYO,
            outcome_ours=fixed["ours"],
            outcome_yoyo=fixed["yoyo"],
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        drop_all(used)


if __name__ == "__main__":
    main()
