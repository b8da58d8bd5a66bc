# Set-up and entry points. Needs only Python >= 3.11 with venv and pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: table5 test lint format all clean-results

# The main job: the study's Table 5 on the default simulator backend, then printed.
table5: $(STAMP)
	$(BIN)/snakemake --cores 1 results/table5.csv
	$(BIN)/servelab table show results/table5.csv

# Everything: all tables and figures of the full grid.
all: $(STAMP)
	$(BIN)/snakemake --cores 1 all

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# What CI checks before the tests: lint and formatting of the Python code, then of the workflow.
LINT_PATHS := src tests workflow benchmarks
SNAKE_PATHS := Snakefile workflow/rules

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/snakefmt --check $(SNAKE_PATHS)
	$(BIN)/snakemake --lint

# Rewrites files in place: the fix for what `make lint` reports as unformatted.
format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/snakefmt $(SNAKE_PATHS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean-results:
	rm -rf results/* .snakemake
