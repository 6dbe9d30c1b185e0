# make demo: set up .venv and run the quick start's main job on the embedded default model.
# make test: set up .venv and run ruff and the whole test suite in two workers (what CI runs).
# Set-up reruns only when a pyproject or the set-up script changed.

VENV := .venv
STAMP := $(VENV)/.propel-setup

$(STAMP): scripts/setup.sh pyproject.toml $(wildcard domains/*/pyproject.toml)
	bash scripts/setup.sh
	touch $@

.PHONY: setup demo test
setup: $(STAMP)

demo: setup
	$(VENV)/bin/propel demo

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	# two workers on two cores: one torch thread each (and in the commands they start), as
	# docs/scaling.md advises; with torch's thread a core, two busy workers waited on each other's
	# threads at every operation
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder
