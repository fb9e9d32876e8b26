"""The workflow floor, on top of every layer: what Snakemake's rules and dvc.yaml's stages call.

The file layout of each step (paths), the DVC parameters (params, dvc_shards), the code each step's
outputs depend on (step_code), the `train` command (train), model selection on held-out noisy labels
(selection), the run grid's cost (gridplan), provenance checks (trace) and the preload server. The
configuration they read is noisymlt.config; the infrastructure under everything is noisymlt.core.
"""
