# fast_parallel: `make demo` (the main job) and `make test` (the tests).
# Both build the environment first; a second run installs nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fast_parallel-ready
SETUP_INPUTS := $(wildcard requirements/*.txt) setup.py scripts/setup_env.sh

.PHONY: env demo test clean-env

env: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	VENV=$(VENV) bash scripts/setup_env.sh
	@touch $@

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q tests

clean-env:
	rm -rf $(VENV)
