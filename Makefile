# The single entry point: every command a developer or CI runs is here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast lint typecheck fmt bench demo reliability-report clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench,mcp,inspect]'
	touch $(STAMP)

demo: install
	$(BIN)/toolq demo

test: install
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not integration and not e2e and not netns"

# Refreshes the committed docs/RELIABILITY.md from a full run of the reliability tests.
reliability-report: install
	RELIABILITY_REPORT=docs/RELIABILITY.md $(BIN)/pytest tests/reliability tests/api/http

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
