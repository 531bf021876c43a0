# make sale  - set up and run a whole flash sale end to end (flashsale sale, defaults)
# make test  - set up and run the test suite on the real services
# make bench - set up (wrk included) and measure each hop side by side: flashsale bench
VENV ?= .venv
PYTHON ?= python3

.PHONY: install services tools test sale bench

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

test: install services
	$(VENV)/bin/pytest -q

sale: install services
	$(VENV)/bin/flashsale sale

bench: install services tools
	$(VENV)/bin/flashsale bench
