# The two commands a newcomer types: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint typecheck pytest clean sim-compiled

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gpufleet up --demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck pytest

# The pure tests only (no processes, servers or sockets: see tests/conftest.py), in seconds.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not process"

# Opt-in: the simulator's hot path compiled with mypyc, in place (~2 min; the same results,
# faster: docs/sim.md "How fast it runs"). `make clean` goes back to the interpreted modules.
sim-compiled: $(STAMP)
	nice $(BIN)/python tools/compile_sim.py

clean:
	$(PYTHON) tools/compile_sim.py --clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build
