# Two entry points: `make lab` and `make test`. Both create .venv and install specfix with its
# notebook, test and book extras (from pyproject.toml, the one dependency list); a second run reuses it.
# `make book` renders the chapters as a static site, `make book-check` checks it in headless Chromium.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specfix-installed
# CPU CI: two workers for the package tests; notebooks run one at a time (kernel start-up races).
# SPECFIX_CHECK_FIGURES=1: a cell that leaves a figure undisplayed fails (specfix.figures.style.watch_figures).
PYTEST_WORKERS ?= 2

# The book and its check: Sphinx + MyST-NB (docs/conf.py) run every chapter; Debian's Chromium reads it.
BOOK      := build/book
BOOK_JOBS ?= 2
CHROMIUM  ?= /usr/bin/chromium
# JupyterLab refuses to start as root unless told; containers usually run as root. LAB_ARGS adds options.
LAB_ARGS  ?=
LAB_ROOT  := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test lint unit notebooks gpu-test clean book book-check lab-check gpu-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[book,dev,notebooks]'
	touch $(STAMP)

# Token authentication and the loopback address stay as JupyterLab sets them; open the URL it prints.
lab: $(STAMP)
	$(BIN)/jupyter lab --ip=127.0.0.1 $(LAB_ROOT) $(LAB_ARGS) notebooks/

test: lint unit notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# `make test` again reruns only what changed: each part leaves a stamp under build/test/<scale>/ once it
# passed (dated from its start), and make reruns a part only when a file it reads is newer: the package
# tests read every file of the repository (git's list: tracked, or new and not ignored), a chapter reads
# itself, the package and pyproject.toml. `rm -rf build/test` reruns everything.
SCALE    := $(or $(SPECFIX_SCALE),ci)
TESTED   := build/test/$(SCALE)
INPUTS   := $(wildcard $(shell git ls-files -co --exclude-standard 2>/dev/null))
PACKAGE  := $(filter specfix/%,$(INPUTS)) pyproject.toml
CHAPTERS := $(wildcard notebooks/*.ipynb)

# The package tests run on the CPU (Triton's interpreter), as in CI, whatever the machine; where a GPU is
# present the tests marked `cuda` then run on it, one at a time (they share the GPU and count its syncs).
unit: $(TESTED)/unit.passed

$(TESTED)/unit.passed: $(STAMP) $(INPUTS)
	@mkdir -p $(@D) && touch $@.start
	SPECFIX_DEVICE=cpu $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not cuda" tests
	if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pytest -q -m cuda tests; fi
	@mv $@.start $@

# Each chapter through nbmake in a fresh kernel, as a reader runs it (SOLUTIONS = False).
notebooks: $(CHAPTERS:notebooks/%=$(TESTED)/%.passed)

$(TESTED)/%.ipynb.passed: notebooks/%.ipynb $(PACKAGE) $(STAMP)
	@mkdir -p $(@D) && touch $@.start
	SPECFIX_SCALE=$(SCALE) SPECFIX_CHECK_FIGURES=1 $(BIN)/python -m pytest -q --nbmake --nbmake-timeout=300 $<
	@mv $@.start $@

# A fresh build every time (-E, and the old folder removed): the pages show what the code does today.
# -W: any warning (a broken cross-reference, an unreadable output) fails the build, as a failing cell does.
book: $(STAMP)
	rm -rf $(BOOK)
	SPECFIX_SCALE=$${SPECFIX_SCALE:-ci} SPECFIX_DEVICE=$${SPECFIX_DEVICE:-cpu} \
		$(BIN)/sphinx-build -E -W --keep-going -j $(BOOK_JOBS) -b html -c docs -d $(BOOK)/doctrees . $(BOOK)/html
	@echo "The book is built: open file://$(abspath $(BOOK))/html/index.html"
	@echo "(search shows page excerpts only over http: $(BIN)/python -m http.server -b 127.0.0.1 -d $(BOOK)/html)"

book-check: book
	$(BIN)/python scripts/book_check.py $(BOOK)/html --chromium $(CHROMIUM)

# Each chapter opened in JupyterLab (started by `make lab`) in headless Chromium, all cells run from the UI;
# fails on an error, a figure that does not render, a widget slider that does not redraw its figure.
# Screenshots in build/lab/screenshots/.
lab-check: $(STAMP)
	$(BIN)/python scripts/lab_check.py --chromium $(CHROMIUM)

# On a GPU machine: the cuda tests, every chapter at full scale (and with SOLUTIONS = True), a bench smoke;
# a table and a JSON report (scripts/gpu_check.py says how to split it and how to record three runs). It uses
# the venv where there is one, else $(PYTHON) (e.g. python3 with PYTHONPATH set, on a machine without network).
GPU_PYTHON     ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?= --jobs 8
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build
