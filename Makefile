# Two entry points, each doing all set-up itself:
#   make demo   create .venv and run the whole pipeline on the embedded dataset (CPU, offline)
#   make test   create .venv and run the test suite
#   make smoke  create .venv and run the paper's configuration briefly (workflow/profiles/smoke)
# and the demo through DVC (dvc.yaml: a stage a phase, each running Snakemake; `dvc status` is clean after it):
#   make demo-dvc   create .venv, `dvc init` if needed, `dvc repro`; after a finished `make demo`, it records that
#                   demo's outputs (dvc commit) instead of rerunning it
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: env demo demo-dvc smoke test test-fast lint dryrun clean-demo

# The editable install builds with this venv's setuptools (--no-build-isolation): pyproject.toml's license
# fields (PEP 639) need 77 or later, newer than what a Python 3.11 venv starts with. The lock installs with uv
# (pinned in it; about a quarter of pip's time), from the sources pip is configured with
# (scripts/uv_pip_options.py); where uv cannot (not on the index, a setting it lacks), pip installs the same lock.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77"
	{ $(PY) -m pip install --quiet $$(grep '^uv==' requirements.lock) && $(VENV)/bin/uv pip install --python $(PY) \
	  --quiet --compile-bytecode $$($(PY) scripts/uv_pip_options.py) -r requirements.lock; } || \
	  $(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

env: $(STAMP)

# The demo on every core, as many runs at once as the available memory holds (each train job asks for its measured
# peak: workflow/profiles/demo/config.yaml); without /proc/meminfo, by the cores alone.
DEMO_MEM_MB ?= $(shell awk '/^MemAvailable:/ {print int($$2 / 1024)}' /proc/meminfo 2>/dev/null)
demo: $(STAMP)
	$(VENV)/bin/snakemake --profile workflow/profiles/demo $(if $(DEMO_MEM_MB),--resources mem_mb=$(DEMO_MEM_MB))
	@cat reports/table_total.md

# dvc.yaml's stages run `snakemake` from PATH: the venv's. --no-scm only outside a git checkout (a copied tree).
# No dvc.lock yet but a finished Snakemake demo (`make demo`; Snakemake's dry run, with the profile and layers of
# params.yaml's `dvc` block, has nothing to do): `dvc commit --force` records its outputs (DVC hashes them; nothing
# retrains), then `dvc repro` finds nothing to run. `dvc commit` rewrites the files it records (new modification
# times), so Snakemake would then rerun the demo: when its dry run plans jobs, `snakemake --touch` gives the files
# back their order (--keep-incomplete: a failed touch deletes nothing). DVC's default cache type (copies) is kept:
# with hard links, files of equal content share one inode and its time, which Snakemake's time order cannot follow.
DVC_ENV := PATH="$(abspath $(VENV))/bin:$$PATH"
DVC_SMK = $(VENV)/bin/snakemake $$($(PY) -c 'import yaml; d = yaml.safe_load(open("params.yaml"))["dvc"]; \
	print("--profile", d["profile"], "--configfile", d["configfiles"])')
demo-dvc: $(STAMP)
	test -d .dvc || $(VENV)/bin/dvc init --quiet $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm)
	@if [ ! -f dvc.lock ] && [ -f reports/results.parquet ]; then \
	  if $(DVC_SMK) -n 2>&1 | grep -q "Nothing to be done"; then \
	    echo "demo-dvc: the Snakemake demo (make demo) is complete: recording its outputs in dvc.lock" \
	         "with 'dvc commit --force' instead of rerunning them"; \
	    $(DVC_ENV) $(VENV)/bin/dvc commit --force --quiet && echo "demo-dvc: recorded every stage"; \
	    $(DVC_SMK) -n 2>&1 | grep -q "Nothing to be done" || \
	      $(DVC_SMK) --touch --keep-incomplete --quiet >/dev/null; \
	  else \
	    echo "demo-dvc: outputs from an unfinished or outdated Snakemake demo: 'dvc repro' runs the stages, and" \
	         "Snakemake inside them what is missing or out of date"; \
	  fi; \
	fi
	$(DVC_ENV) $(VENV)/bin/dvc repro
	@cat reports/table_total.md

# The paper's configuration, every method and ablation code path, one iteration an epoch, on a VOC stand-in
# (workflow/profiles/smoke): the first thing to run on a new machine or GPU node
smoke: $(STAMP)
	$(VENV)/bin/snakemake --profile workflow/profiles/smoke

# the layers of .importlinter first: an upward import fails in seconds, before the suite; then the manual
# (mkdocs.yml, docs/): a broken link or anchor fails --strict. Not --quiet: it hides the warnings that --strict
# counts, and the build passes. Built into a temporary folder, removed after.
# The suite runs on every core (pytest-xdist, one worker a core, at most 8: past that its longest test sets the wall
# time); the SLURM and SSH tests go to one worker (tests/conftest.py). TEST_WORKERS=0: one process, as plain pytest.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 8 ] && n=8; echo $$n)
PYTEST_XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"; \
	  status=$$?; rm -rf "$$site"; exit $$status
	$(PY) -m pytest $(PYTEST_XDIST)

test-fast: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest $(PYTEST_XDIST) -m "not slow and not slurm"

# Snakemake's lints but the one asking each rule for a conda environment or container (none is offered: docs/slurm.md)
lint: $(STAMP)
	$(PY) scripts/lint_workflow.py

dryrun: $(STAMP)
	$(VENV)/bin/snakemake reports/table_total.tex -n --quiet rules

clean-demo:
	rm -rf data/raw/toy data/toy data/pretrained runs/toy reports/*.* logs benchmarks .snakemake
