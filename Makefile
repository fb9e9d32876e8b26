# Two entry points, each doing all set-up itself:
#   make demo   create .venv and run the whole pipeline on the embedded dataset (CPU, offline)
#   make test   create .venv and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: env demo test test-fast lint dryrun clean-demo

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/snakemake --profile workflow/profiles/demo
	@cat reports/table_total.md

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not slurm"

lint: $(STAMP)
	$(VENV)/bin/snakemake --lint

dryrun: $(STAMP)
	$(VENV)/bin/snakemake reports/table_total.tex -n --quiet rules

clean-demo:
	rm -rf data/raw/toy data/toy runs/toy reports/*.* logs benchmarks .snakemake
