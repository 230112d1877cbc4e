# Two entry points: `make lab` and `make test`. Both create .venv and install specfix with its
# notebook and test extras (from pyproject.toml, the one dependency list); a second run reuses it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specfix-installed
# CPU CI: two workers for the package tests; notebooks run one at a time (kernel start-up races).
PYTEST_WORKERS ?= 2

.PHONY: lab test lint unit notebooks gpu-test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,notebooks]'
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

test: lint unit notebooks

lint: $(STAMP)
	$(BIN)/ruff check .

# The package tests run on the CPU (Triton's interpreter), as in CI, whatever the machine; where a GPU is
# present the tests marked `cuda` then run on it, one at a time (they share the GPU and count its syncs).
unit: $(STAMP)
	SPECFIX_DEVICE=cpu $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not cuda" tests
	if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pytest -q -m cuda tests; fi

notebooks: $(STAMP)
	SPECFIX_SCALE=$${SPECFIX_SCALE:-ci} $(BIN)/python -m pytest -q --nbmake --nbmake-timeout=300 notebooks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
