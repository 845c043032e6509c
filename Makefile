# Two commands do everything on a fresh machine:
#   make demo   set up (venv, install, default model) and run the showcase
#   make test   set up the same way and run the whole test suite
#
# TORCH_SPEC chooses the torch that the set-up installs when the venv has none
# (default: the CPU build). GPU users: make test TORCH_SPEC="torch==2.14.1"
# or install their torch into .venv first; an existing torch is never replaced.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# SGLang's frontend client, for the tests that run SGLang's own programs through it
# (tests/lang/test_sglang_client.py): test-only, never a runtime dependency. --no-deps:
# the package pins SGLang's whole server stack (a CUDA torch); the few modules its
# client imports are in the dev extra.
SGLANG_CLIENT_SPEC ?= sglang==0.5.23
PY := $(VENV)/bin/python
STAMP := $(VENV)/.radixlm-installed

.PHONY: setup demo test bench lint clean

setup: $(STAMP)
	@$(PY) -m radixlm.runtime.entrypoints.cli pull

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_SPEC)
	@$(PY) -m pip install --quiet -e ".[dev]"
	@$(PY) -m pip install --quiet --no-deps "$(SGLANG_CLIENT_SPEC)"
	@touch $(STAMP)

demo: setup
	@$(PY) examples/showcase.py

test: setup
	@$(PY) -m pytest -q tests

bench: setup
	@$(PY) benchmarks/bench_engine.py

lint: $(STAMP)
	@$(VENV)/bin/ruff check lang runtime kernels tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
