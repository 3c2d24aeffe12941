# make demo | make test | make clean -- each works from a fresh clone (Linux).
# The lab's environment is exactly uv.lock (pyproject.toml's [tool.uv] says for what machine): `uv sync --locked`
# installs it and refuses a lock that no longer matches pyproject.toml (`uv lock` rewrites it). torch comes from the
# lock too: its CPU build, from the wheel on the lab machine's disk. On a machine without that wheel, or for the CUDA
# build, name torch's index: make install TORCH_INDEX=https://download.pytorch.org/whl/cu126 -- pip installs the
# locked torch version from there and uv installs the rest of the lock around it (README.md, Install).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := $(shell sed -n '/^name = "torch"$$/{n;s/^version = "\([^+"]*\).*/\1/p;}' uv.lock)
TORCH_INDEX ?=
# Every process make starts writes the bytecode of the modules it imports, once (Python's default), even where the
# environment sets PYTHONDONTWRITEBYTECODE (some container images do): the install compiles nothing, and a suite of
# hundreds of processes would otherwise recompile torch and Ray in each of them.
export PYTHONDONTWRITEBYTECODE :=
# uv sync installs into this venv (not a venv of its own making)
export UV_PROJECT_ENVIRONMENT := $(VENV)
# make test's pytest runs in two processes (pytest-xdist), the minicluster's tier in one of them (tests/conftest.py;
# docs/testing.md has the times). PARALLEL= runs it in one.
PARALLEL ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: demo test test-fast install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip $(UV)

# uv resolves and unpacks in parallel (the lab and its test extra: about 10 s on 2 cores, where pip took a minute).
# --inexact: keep what the lock does not name (uv itself, and Horovod, which make horovod builds into the venv).
# Nothing is byte-compiled here: Python compiles a module when it is first imported and keeps it (see
# PYTHONDONTWRITEBYTECODE above).
UV := uv==0.13.9
UV_SYNC = $(BIN)/uv sync --locked --inexact --quiet $(if $(TORCH_INDEX),--no-install-package torch)
TORCH_FROM_INDEX = $(if $(TORCH_INDEX),$(BIN)/pip install --quiet --no-compile --index-url $(TORCH_INDEX) \
	torch==$(TORCH_VERSION))

# The lab: its commands and every extra but the tests'
$(VENV)/.installed: $(BIN)/python pyproject.toml uv.lock
	$(TORCH_FROM_INDEX)
	$(UV_SYNC) --extra all
	touch $@

# The lab and its tests, benchmarks and docs
$(VENV)/.installed-test: $(VENV)/.installed
	$(UV_SYNC) --all-extras
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The quickstart sweep (1 and 2 workers, 2 seeds each) and its report; re-running resumes it.
demo: install
	$(BIN)/scaling sweep experiments/quickstart.yaml --out results/demo
	$(BIN)/scaling report results/demo

# ruff: lint and format ([tool.ruff] in pyproject.toml; `.venv/bin/ruff format .` writes it).
# The docs site (mkdocs.yml) builds with --strict into build/site, so a broken link or a page missing from the nav
# fails the suite, and its benchmark tables and the figures its prose quotes must match bench/results/
# (bench/summarize.py --check).
test: install-test horovod
	$(BIN)/lint-imports
	$(BIN)/ruff check --quiet . && $(BIN)/ruff format --check --quiet .
	$(BIN)/python bench/summarize.py --check && $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q $(PARALLEL)

# The unit tier only (pytest -m unit: no Ray, Horovod, minicluster or training runs), for quick iterations.
test-fast: install-test
	$(BIN)/lint-imports
	$(BIN)/ruff check --quiet . && $(BIN)/ruff format --check --quiet .
	$(BIN)/python -m pytest -q -m unit

# Removes the venv, every run and sweep under results/, and pytest's cache.
clean:
	rm -rf $(VENV) results .pytest_cache

# Benchmarks of the lab's own cost (bench/): the ones bench/run_all.py lists (BENCHMARKS), each writing
# bench/results/<name>.json, then bench/summarize.py writes their tables into docs/ (docs/benchmarks.md lists them
# with the time each took), plus the Horovod build the first time (the all-reduce benchmark compares it with gloo).
# `make bench QUICK=1` (or `make bench-quick`) is the few-minute variant, written to bench/results/quick/.
.PHONY: bench bench-quick
bench: install horovod
	$(BIN)/python bench/run_all.py $(if $(filter 1 yes true,$(QUICK)),--quick)

bench-quick: install horovod
	$(BIN)/python bench/run_all.py --quick

# Horovod 0.28.1, built from PyPI's source release against the venv's torch, with gloo,
# without MPI/TensorFlow/MXNet; with NCCL where torch is a CUDA build, which needs nvcc and NCCL: the
# script refuses (exit 3) rather than build CPU-only when either is missing (docs/horovod.md). The wheel
# is cached under ~/.cache/scaling/wheels, keyed by horovod, torch, python and cpu/cuda, so a new venv installs it
# without compiling (the build's measured time: docs/horovod.md). It needs g++ >= 9 (C++17).
.PHONY: horovod
horovod: $(VENV)/.horovod

$(VENV)/.horovod: $(VENV)/.installed scripts/build_horovod.sh
	scripts/build_horovod.sh $(VENV)
	touch $@
