# make sale       - set up and run a whole flash sale end to end (flashsale sale, defaults)
# make test       - set up, then lint (ruff), type-check (mypy) and run the whole test suite on the real services
# make test-fast  - the same without the slow tests (those that start server processes or a whole sale)
# make lint       - ruff (lint + format check) and mypy only
# make bench      - set up (wrk included) and measure each hop side by side: flashsale bench
VENV ?= .venv
PYTHON ?= python3

.PHONY: install services tools lint test test-fast sale bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
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
	$(VENV)/bin/pytest -q

test-fast: install services tools lint
	$(VENV)/bin/pytest -q -m "not slow"

sale: install services
	$(VENV)/bin/flashsale sale

bench: install services tools
	$(VENV)/bin/flashsale bench
