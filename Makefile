# make sale       - set up and run a whole flash sale end to end (flashsale sale, defaults; with the
#                   charts extra, so flashsale sale --report draws its charts)
# make test       - set up, then lint (ruff), type-check (mypy) and run the whole test suite on the real
#                   services, in TEST_WORKERS parallel pytest workers
# make test-fast  - the same without the slow tests (those that start server processes or a whole sale)
# make lint       - ruff (lint + format check) and mypy only
# make bench      - set up (wrk included) and measure each hop side by side: flashsale bench
# make docs       - write docs/CONFIGURATION.md from the settings model (python -m service.config_doc)
# make faults     - the fault suite on private Redis, MariaDB and RabbitMQ servers (tests/faults, ~15 min):
#                   prints the table and writes it to $(FAULTS_OUT) (docs/RELIABILITY.md keeps a run's table)
# make faults-ci  - the fault cases CI runs (.ci/run; a few minutes)
# make chaos      - one long sale under faults drawn from a seed (nightly, not CI): CHAOS_SEED (1),
#                   CHAOS_MINUTES (20); the same seed draws the same schedule; table to $(CHAOS_OUT)
VENV ?= .venv
PYTHON ?= python3
FAULTS_OUT ?= faults-report.md
CHAOS_SEED ?= 1
CHAOS_MINUTES ?= 20
CHAOS_OUT ?= chaos-report.md
# Parallel pytest workers of make test / test-fast (pytest-xdist): each worker is a session of its
# own (its own database, key prefix and queues); a test module stays on one worker (loadfile).
TEST_WORKERS ?= 4

.PHONY: install services tools lint test test-fast sale bench docs faults faults-ci chaos

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c requirements.lock -e '.[test,charts]'
	touch $@

install: $(VENV)/.installed

services:
	./scripts/ensure-services

tools:
	./scripts/ensure-tools

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install services tools lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: install services tools lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

sale: install services
	$(VENV)/bin/flashsale sale

bench: install services tools
	$(VENV)/bin/flashsale bench

docs: install
	$(VENV)/bin/python -m service.config_doc > docs/CONFIGURATION.md.tmp
	mv docs/CONFIGURATION.md.tmp docs/CONFIGURATION.md

faults: install tools
	FLASHSALE_FAULTS_OUT=$(FAULTS_OUT) $(VENV)/bin/pytest -q -m faults tests/faults

faults-ci: install
	$(VENV)/bin/pytest -q -m faults_ci tests/faults

chaos: install tools
	CHAOS_SEED=$(CHAOS_SEED) CHAOS_MINUTES=$(CHAOS_MINUTES) FLASHSALE_FAULTS_OUT=$(CHAOS_OUT) \
		$(VENV)/bin/pytest -q -s -m chaos tests/faults/test_chaos.py
