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

.PHONY: run test install services migrate demo bench clean browser

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

services:
	@DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) scripts/dev/services.sh

migrate: install services
	$(BIN)/python -m app migrate

demo: migrate
	$(BIN)/python -m app demo-data

# Everything: services, schema, demo data, then web + worker + scheduler + mail viewer via honcho.
run: export MAIL_PROVIDER ?= smtp
run: export SMTP_URL ?= smtp://127.0.0.1:1025
run: demo
	$(BIN)/python -m app digest-now --all
	@echo "web: http://127.0.0.1:$${DEV_PORT:-8000}  mail viewer: http://127.0.0.1:$${DEV_PORT:-8000}/dev/mail"
	$(BIN)/honcho -f Procfile.dev start

# Browser tests drive Debian's chromium (no browser download); install it once, as root.
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  elif sudo -n true 2>/dev/null; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "WARNING: /usr/bin/chromium missing and not root: browser tests will be skipped"; fi; }

test: install services browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: migrate
	$(BIN)/python scripts/bench/ingest.py

clean:
	rm -rf $(VENV) .var mail-out test-artifacts
