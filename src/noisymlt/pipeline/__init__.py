"""The workflow's infrastructure, used by Snakemake's rules, dvc.yaml's stages and every step.

Configuration and its checks (config, schema), the file layout of each step (paths), the DVC parameters
(params), code identity (codedeps, step_code), provenance manifests and their check (manifest, trace),
model selection on held-out noisy labels (selection), the run grid (gridplan), the preload server, locks
and safe file writes (files, jsonlog). Nothing here trains or evaluates a model.
"""
