# Two commands on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DATABASE_URL ?= postgresql://localhost/notify
export REDIS_URL ?= redis://localhost:6379/0
export TEST_DATABASE_URL ?= postgresql://localhost/notify_test
export TEST_REDIS_URL ?= redis://localhost:6379/15
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: run test lint test-fast test-pure test-pgbouncer install services migrate demo bench drill clean browser pgbouncer messages

# Unset APP_ENV means production (app/platform/config.py): the local targets say development explicitly,
# and reach their prerequisites too (run -> demo -> migrate). Tests set APP_ENV=test themselves.
run demo migrate bench: export APP_ENV ?= development
# Production refuses to start without the sender's postal address; the demo mails show this one.
run demo: export MAIL_POSTAL_ADDRESS ?= Demo Ltd, 1 Example Street, Lisbon

install: $(VENV)/.installed

# uv resolves and installs the project into the venv (pip only fetches uv itself): the same
# packages as `pip install -e '.[dev]'`, several times faster (a fresh clone's `make test` starts here).
# --compile-bytecode: the packages' bytecode is written now (pip did; uv does not by default), so a
# process started where PYTHONDONTWRITEBYTECODE is set (many CI and container images) does not compile
# them from source on every start: a worker process's start-up CPU 1.3 s without, 0.6 s with (and the
# project's own packages with compileall; Python still checks each against its source).
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet 'uv>=0.5'
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'
	$(BIN)/python -m compileall -q app actors digest tracking scripts
	@touch $@

services:
	@DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) scripts/dev/services.sh

migrate: install services
	$(BIN)/python -m app migrate

demo: migrate
	$(BIN)/python -m scripts.demo_data

# Everything: services, schema, demo data, then web + worker + scheduler + mail viewer via honcho.
# The settings and the demo keys go to .env (git-ignored), which every later command reads
# (`.venv/bin/notify …` in the next terminal) and honcho hands to each process.
run: export MAIL_PROVIDER ?= smtp
run: export SMTP_URL ?= smtp://127.0.0.1:1025
# One host for everything the developer opens: the web process (BASE_URL starts every link in mails
# and pages), the mail viewer and the feed demo, on the ports below; the banner prints the same.
run: export DEV_PORT ?= 8000
run: export MAIL_VIEWER_PORT ?= 8025
run: export FEED_DEMO_PORT ?= 8026
run: export BASE_URL ?= http://127.0.0.1:$(DEV_PORT)
run: export MAIL_VIEWER_URL ?= http://127.0.0.1:$(MAIL_VIEWER_PORT)/dev/mail
run: export FEED_DEMO_URL ?= http://127.0.0.1:$(FEED_DEMO_PORT)/?user=demo-ana
# The feed demo page (scripts/dev/feeddemo.py) calls the API from its own origin; send-now mail
# waits a minute for what the person sees in the feed meanwhile.
run: export FEED_ALLOWED_ORIGINS ?= http://127.0.0.1:$(FEED_DEMO_PORT)
run: export UNSEEN_GRACE_SECONDS ?= 60
run: demo
	$(BIN)/python -m scripts.dev.env_file $(DEV_SETTINGS)
	$(BIN)/python -m app digest-now --all
	@$(BIN)/python -m scripts.dev.banner
	$(BIN)/honcho -f Procfile.dev start

# What `make run` writes to .env (tests/dev/test_banner.py reads this line).
DEV_SETTINGS = APP_ENV DATABASE_URL REDIS_URL MAIL_PROVIDER SMTP_URL MAIL_POSTAL_ADDRESS BASE_URL MAIL_VIEWER_URL FEED_DEMO_URL FEED_ALLOWED_ORIGINS

# The message catalogs (app/locale/, docs/i18n.md): extract the code's messages, add the new ones to
# every locale (to translate), remake the pseudo-locale en-XA.
messages: install
	$(BIN)/python -m scripts.dev.messages

# Browser tests drive Debian's chromium (no browser download); install it once, as root.
browser:
	@sh scripts/dev/apt-install.sh chromium /usr/bin/chromium "browser tests will be skipped"

# PgBouncer (Debian's package) for the PgBouncer pass of `make test`; install it once, as root.
pgbouncer:
	@sh scripts/dev/apt-install.sh pgbouncer /usr/sbin/pgbouncer "the PgBouncer pass of make test is skipped"

# pytest-xdist workers for the suite (TEST_WORKERS=0: one process). Each worker has its own
# database and Redis db, derived from TEST_DATABASE_URL / TEST_REDIS_URL (tests/conftest.py).
# 4, twice the 2 cores of the machines it runs on: many tests wait on processes and sockets, and 3
# workers left the cores idle a quarter of the time (docs/history.md measures 3, 4 and 5).
TEST_WORKERS ?= 4
# One test at a time per worker, the slow ones first (tests/conftest.py orders them): the drills start
# early instead of ending the run alone.
XDIST = -n $(TEST_WORKERS) --dist load --maxschedchunk 1

# The integration tests (the slow ones too: real worker and scheduler processes) through a private
# PgBouncer in transaction pooling mode on a free port (PGBOUNCER_PORT to choose one): scripts/dev/pgbouncer.py.
# Not the `varies_input` modules (fuzzing, hostile input: the same pooled request path with other
# input); tests/checks/test_pooling_rules.py checks from the source what pooling forbids (docs/testing.md).
PGBOUNCER_PASS = $(BIN)/python -m scripts.dev.pgbouncer -- \
	$(BIN)/python -m pytest $(XDIST) -m "not browser and not pure and not varies_input" $(PYTEST_ARGS)

# The checks that read the source: lint, format and types (pyproject.toml [tool.ruff], [tool.mypy]).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The API fuzz module builds its schemathesis cases while it is collected: in a process of its own
# beside the xdist run (one more worker, gwN after the others), it is collected once instead of by
# every worker (scripts/dev/beside.py).
FUZZ_BESIDE = $(BIN)/python -m scripts.dev.beside --worker gw$(if $(filter 0,$(TEST_WORKERS)),1,$(TEST_WORKERS)) \
	tests/web/test_api_fuzz.py --

# The suite starts dozens of Python processes (xdist workers, worker, scheduler and web processes, the
# drills'): with bytecode caching off (PYTHONDONTWRITEBYTECODE, which some CI images set) each one
# compiles every module it imports from source again, and each xdist worker rewrites every test
# module's asserts again. An empty value turns it off for the suite (the caches are git-ignored).
test test-pgbouncer test-fast test-pure run demo migrate bench drill: export PYTHONDONTWRITEBYTECODE =

# Everything, then the integration tests once more through PgBouncer.
test: install lint services browser pgbouncer
	$(FUZZ_BESIDE) $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)
	$(PGBOUNCER_PASS)

test-pgbouncer: install services pgbouncer
	$(PGBOUNCER_PASS)

# Everything but the slow (killed processes, timeouts) and browser tests: the inner loop.
test-fast: install services
	$(BIN)/python -m pytest $(XDIST) -m "not slow and not browser" $(PYTEST_ARGS)

# The pure tests (grouping, ranking, rendering, codes, templates) with Postgres and Redis unreachable.
test-pure: install
	TEST_DATABASE_URL=postgresql://127.0.0.1:9/unreachable TEST_REDIS_URL=redis://127.0.0.1:9/0 \
		$(BIN)/python -m pytest -m pure $(PYTEST_ARGS)

# Every benchmark once, each beside its naive baseline or peer, into one report: BENCHMARKS.md,
# docs/benchmarks.json and docs/benchmarks.png (about two hours, the soak one of them; see docs/testing.md "Benchmarks").
bench: migrate
	@sh scripts/dev/apt-install.sh wrk /usr/bin/wrk "the click benchmark uses its own asyncio client"
	$(BIN)/python scripts/bench/report.py $(BENCH_ARGS)

# Fault drills at full scale against their own Postgres and Redis (minutes; small versions run in make test).
drill: install
	$(BIN)/python scripts/drill.py

clean:
	rm -rf $(VENV) .var mail-out test-artifacts
