# Two commands for a newcomer: `make demo` (set up + main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup demo test lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a CUDA build of several GB.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[local,test]'
	# SpecForge 0.2.0, the trainer the exports' trainer_parity check runs: --no-deps (it pins torch, transformers
	# and sglang); the data modules the check imports need only torch, transformers and pydantic.
	$(PY) -m pip install -q --no-deps specforge==0.2.0
	touch $@

demo: setup
	$(VENV)/bin/eagle-data demo

test: setup
	$(VENV)/bin/ruff check eagle_data eagle_data_tests benchmarks
	# Two workers on two cores: the suite is CPU-bound (a third worker made it slower). The 15 slowest are listed.
	# Files go out in collection order, long ones first (conftest.py); xdist would sort them by test count.
	$(VENV)/bin/pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations=15

lint: setup
	$(VENV)/bin/ruff check eagle_data eagle_data_tests benchmarks
