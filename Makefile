# The single entry point: every command a developer or CI runs is here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install system-packages test test-fast lint typecheck fmt bench demo reliability-report viewer-screenshots clean

# Debian's packages the tests and the bench use: a headless Chromium for the viewer's browser
# tests, and jq, the bench's baseline for toolq view. Installed where apt-get is and we are
# root; elsewhere the browser tests skip, saying so.
SYSTEM_PACKAGES := chromium:chromium chromedriver:chromium-driver jq:jq

install: $(STAMP) system-packages

system-packages:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
		command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make install: installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	else \
		echo "make install:$$missing not installed (needs root and apt-get): the browser tests skip and make bench's viewer case cannot run"; \
	fi

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

# Refreshes the committed screenshots of the viewer (docs/viewer/) from a run of its browser tests.
viewer-screenshots: install
	VIEWER_SCREENSHOTS=docs/viewer $(BIN)/pytest -m browser tests/api/http/viewer -p no:cacheprovider

bench: install
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
