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

# Debian's Slurm and munge for tests/test_clusters.py where this machine
# allows (root, apt-get); a second run skips this step.
SLURM_STAMP := $(VENV)/.slurm-checked

$(SLURM_STAMP): | $(STAMP)
	bash scripts/install_slurm.sh
	@touch $@

test: $(STAMP) $(SLURM_STAMP)
	$(PY) -m pytest -q tests

clean-env:
	rm -rf $(VENV)
