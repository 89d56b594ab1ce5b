# Two commands on a fresh machine: `make run` (the product) and `make test` (the suite).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/runlog up

test: $(STAMP)
	$(BIN)/python -m pytest -q

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy broker workers gateway runlog tests bench
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench append

clean:
	rm -rf $(VENV) .runlog .pytest_cache .mypy_cache .ruff_cache
