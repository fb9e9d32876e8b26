"""The workflow floor, on top of every layer: what Snakemake's rules call.

Every path pattern (layout), the arguments that depend on a dataset's kind or a params block and the run grid
(paths), the code each step's outputs depend on (step_code), the `train` command (train), model selection on
held-out noisy labels (selection), provenance checks (trace) and the preload server. What the grid costs is
measured and planned by scripts/gridcost.py, outside the package: no step runs it. The configuration they read is noisymlt.config; the
infrastructure under everything is noisymlt.core.
"""
