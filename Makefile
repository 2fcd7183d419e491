# The single entry point: every command a developer or CI runs is here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The package alone, no extra: all `make demo` needs.
CORE_STAMP := $(VENV)/.installed-core

.PHONY: install system-packages test test-fast lint typecheck fmt bench demo docs reliability-report viewer-screenshots clean

# Debian's packages the tests and the bench use: a headless Chromium for the viewer's browser
# tests, and jq, the bench's baseline for toolq view. Installed by the targets that use them
# (test, bench, viewer-screenshots), where apt-get is and we are root; elsewhere the browser
# tests skip, saying so. install and demo install nothing outside .venv. With them, what a
# sandbox worker runs images with: skopeo and umoci (fetch, unpack), runc and runsc (the OCI
# runtimes), catatonit (a container's first process); busybox-static and docker-registry build
# and serve the image tests' images (those tests skip, saying so, without them).
SYSTEM_PACKAGES := chromium:chromium chromedriver:chromium-driver jq:jq \
	skopeo:skopeo umoci:umoci runc:runc runsc:runsc catatonit:catatonit \
	busybox:busybox-static docker-registry:docker-registry

install: $(STAMP)

system-packages:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
		command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make: installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	else \
		echo "make:$$missing not installed (needs root and apt-get): the tests that need them skip, and make bench's viewer and image cases cannot run"; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(CORE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $(CORE_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,bench,mcp,inspect,docs]'
	touch $(CORE_STAMP) $(STAMP)

# The demo needs the package alone: a scripted model, a private Redis and workers, all in .venv.
demo: $(CORE_STAMP)
	$(BIN)/toolq demo

# The suite runs across TEST_PROCESSES processes (pytest-xdist): tests sharing a module's stack
# stay in one, and those starting local stacks run one at a time (tests/parallel.py;
# tests/test_parallel_groups.py checks it). On 2-core machines, 2 took 12.5 to 14 minutes on
# the fastest, 16 to 21 on others, and 16 beside a CPU burner; one process alone
# (TEST_PROCESSES=0) took 26 to 30.
TEST_PROCESSES ?= 2

test: install system-packages
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadgroup

test-fast: install
	$(BIN)/pytest -m "not integration and not e2e and not netns"

# Refreshes the committed docs/RELIABILITY.md from a full run of the reliability tests.
reliability-report: install system-packages
	RELIABILITY_REPORT=docs/RELIABILITY.md $(BIN)/pytest -p no:xdist tests/reliability tests/api/http

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Refreshes the committed screenshots of the viewer (docs/viewer/) from a run of its browser tests.
viewer-screenshots: install system-packages
	VIEWER_SCREENSHOTS=docs/viewer $(BIN)/pytest -m browser tests/api/http/viewer -p no:cacheprovider

bench: install system-packages
	$(BIN)/python -m bench.run

# The documentation site, from docs/ and the code (mkdocs.yml), into site/; it fetches nothing.
docs: install
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
