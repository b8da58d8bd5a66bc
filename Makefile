# Set-up and entry points. Needs only Python >= 3.11 with venv and pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: table5 test lint all clean-results

# The main job: the study's Table 5 on the default simulator backend.
table5: $(STAMP)
	$(BIN)/snakemake --cores 1 results/table5.csv

# Everything: all tables and figures of the full grid.
all: $(STAMP)
	$(BIN)/snakemake --cores 1 all

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check src tests workflow benchmarks
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean-results:
	rm -rf results/* .snakemake manifests/rendered
