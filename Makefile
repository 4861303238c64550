# The two commands of the README. Both set up what is missing first (idempotent, cached).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test unit lint lab-down clean

# setup.sh too: a checkout set up before a package was added to it installs that package
$(VENV)/.installed: pyproject.toml scripts/setup.sh
	@bash scripts/setup.sh
	@touch $@

setup: $(VENV)/.installed

# Boot 2 lab hosts, make the tiny model, deploy the CPU build of vLLM, print the smoke table.
demo: setup
	@bash scripts/demo.sh

# The whole test suite: pure core, captured nvidia-smi outputs, real lab hosts and a real vLLM.
test: setup
	@bash scripts/test.sh

unit: setup
	$(VENV)/bin/pytest -q tests/unit tests/facts

lint: setup
	$(VENV)/bin/ruff check .
	bash scripts/typecheck.sh

lab-down:
	$(VENV)/bin/vllm-fleet lab down
