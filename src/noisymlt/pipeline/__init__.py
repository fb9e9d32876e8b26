"""The workflow floor, on top of every layer: what Snakemake's rules and dvc.yaml's stages call.

Every step declared once for both routes (steps; its files' patterns in layout, dvc.yaml written from it by
dvc_yaml), the arguments that depend on a dataset's kind (paths), the DVC parameters (params), the code each step's
outputs depend on (step_code), the `train` command (train), model selection on held-out noisy labels
(selection), the run grid's cost (gridplan), provenance checks (trace) and the preload server. The
configuration they read is noisymlt.config; the infrastructure under everything is noisymlt.core.
"""
