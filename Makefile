# OpenWorker: `make run` serves the app in embedded mode; `make test` runs the suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
HOST ?= 127.0.0.1
PORT ?= 8000

# The distributed phase of `make test` talks to these (override to point elsewhere).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/openworker
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# Test-only secrets: distributed settings refuse to start without them.
TEST_ENV := DEBUG=1 SECRET_KEY=test-only-secret-key-not-for-production \
	OPENWORKER_ENCRYPTION_KEYS=dGVzdC1vbmx5LWtleS1ub3QtZm9yLXByb2R1Y3Rpb24= \
	OPENWORKER_OUTBOUND_ALLOWLIST=127.0.0.1,localhost OPENWORKER_AUTO_TITLE=0

.PHONY: run dev test lint format install install-dev migrate

$(VENV)/.installed-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(VENV)/.installed-run $@

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

migrate: install
	$(PY) manage.py migrate --noinput

# DEBUG is off: friendly error pages, no tracebacks (README, "On a LAN").
run: migrate
	$(PY) manage.py ensure_admin --url http://$(HOST):$(PORT)
	$(PY) -m openworker.web_server -b $(HOST) -p $(PORT) openworker.asgi:application

# `make run` with Django's debug pages (tracebacks, source): on your own machine only.
dev: migrate
	$(PY) manage.py ensure_admin --url http://$(HOST):$(PORT)
	DEBUG=1 $(PY) -m openworker.web_server -b $(HOST) -p $(PORT) openworker.asgi:application

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: install-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Two phases, one suite: embedded mode (SQLite, in-memory layer) for everything not
# marked `distributed`, then distributed mode (PostgreSQL, Redis, real Celery/Daphne
# processes) for the rest. Without those services the second phase is skipped with a
# warning, except under CI=true, where it fails.
test: lint
	env -u DATABASE_URL -u REDIS_URL $(VENV)/bin/pytest -m "not distributed"
	@if $(PY) -m tests.services "$(TEST_DATABASE_URL)" "$(TEST_REDIS_URL)"; then \
		env $(TEST_ENV) DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
			$(VENV)/bin/pytest -m distributed; \
	elif [ "$$CI" = "true" ]; then \
		echo "CI=true: PostgreSQL or Redis is not reachable; failing." >&2; exit 1; \
	else \
		echo "WARNING: PostgreSQL/Redis not reachable: distributed tests NOT run." >&2; \
	fi
