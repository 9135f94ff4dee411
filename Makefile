# Set-up and everyday commands. Every target creates the virtual environment it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-e2e test-all lint lock clean

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

## demo: an investigation of the toyworld default (offline, CPU, no API key), then its answer key
demo: $(STAMP)
	$(BIN)/sleuth investigate --class cat --reveal

## test: the fast tier (offline, CPU, about 6 minutes on 2 cores, one pytest worker a core); fails if a module of agent/ or tools/ has no fast test
test: $(STAMP)
	$(BIN)/python -m pytest -q --module-use -n auto --maxprocesses 4 --dist worksteal

## test-e2e: the end-to-end tier (whole investigations and audits, Ray, benchmarks, editing pipelines; docs/testing.md)
test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -m e2e

## lint: ruff and mypy (clean on main; CI runs them before the tests)
lint: $(STAMP)
	$(BIN)/ruff check agent tools tests scripts transcripts sleuth
	$(BIN)/python scripts/typecheck.py

## test-all: every tier, the slow tests too (long training, real checkpoints)
test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow or not slow"

## lock: re-resolve requirements.in into the hash-checked requirements.lock
lock:
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --generate-hashes --allow-unsafe --strip-extras --no-header -o requirements.lock requirements.in

clean:
	rm -rf $(VENV) build *.egg-info
