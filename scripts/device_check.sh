#!/usr/bin/env bash
# One prepared check of the CUDA path (see scripts/device_check.py --help for the parts and what each needs).
#   scripts/device_check.sh                        on a GPU machine: all parts, within 8 minutes
#   scripts/device_check.sh --device cpu --quick   anywhere: every part small, GPU parts skipped (< 2 min)
#   scripts/device_check.sh --parts throughput grid   a rerun of some parts only
# Runs from the source tree (PYTHONPATH=src) with the interpreter in $PYTHON, else .venv/bin/python when there
# is one, else python3: no `make env` needed. Output folder: $OUT, default benchmarks/device/.
# Missing libraries can travel as wheels in benchmarks/wheels/, e.g. prepared on a machine with network:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps \
#       -d benchmarks/wheels pyyaml jsonschema jsonschema-specifications referencing rpds-py attrs tqdm
# The Snakemake parts (end_to_end, grid_wall, smoke) need snakemake and its dependencies the same way (each pinned
# to the version in .venv; scripts/device_wheels.py downloads them); one of them, connection_pool, has no wheel on
# PyPI: `pip wheel --no-deps connection_pool==0.0.3 -w benchmarks/wheels`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" scripts/device_check.py "$@"
