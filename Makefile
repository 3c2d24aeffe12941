# make demo | make test | make clean -- each works from a fresh clone (Linux).
# torch 2.13.0 is installed first, from pip's configured index unless TORCH_INDEX names another.
# On Linux, PyPI's torch 2.13.0 is the CUDA build (several GB, with its nvidia-* wheels); the CPU
# build is on PyTorch's own index: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (README.md, Install). pyproject.toml's torch==2.13.0 is then already satisfied by either build.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
TORCH_INDEX ?=
# make test's pytest runs in two processes (pytest-xdist), the minicluster's tier in one of them (tests/conftest.py;
# docs/testing.md has the times). PARALLEL= runs it in one.
PARALLEL ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: demo test test-fast install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# pip byte-compiles what it installs one file at a time (torch alone is thousands: 1 min 45 s of a 3 min 10 s
# install on 2 cores); compileall does it in one process per core. Its status is not checked: like pip's own
# pass, it skips a file the interpreter cannot compile (torch ships one written for Python 3.12). Compiled
# here, not on first import: an environment with PYTHONDONTWRITEBYTECODE would never keep them.
COMPILE = $(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --no-compile $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	$(BIN)/pip install --quiet --no-compile -e .
	$(COMPILE)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet --no-compile -e '.[test]'
	$(COMPILE)
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
