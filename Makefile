# make sale       - set up and run a whole flash sale end to end (flashsale sale, defaults)
# make test       - set up, then lint (ruff), type-check (mypy) and run the whole test suite on the real services
# make test-fast  - the same without the slow tests (those that start server processes or a whole sale)
# make lint       - ruff (lint + format check) and mypy only
VENV ?= .venv
PYTHON ?= python3

.PHONY: install services lint test test-fast sale

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

services:
	./scripts/ensure-services

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install services lint
	$(VENV)/bin/pytest -q

test-fast: install services lint
	$(VENV)/bin/pytest -q -m "not slow"

sale: install services
	$(VENV)/bin/flashsale sale
