"""The paper grid's wall time on one card, from measured runs (the GPU check's ``grid_wall`` part).

The check trains every grid method at paper shapes on the smoke stand-in through the workflow, k runs at a
time on one card as the packing profile runs them (``runs_per_gpu``), start-up, loading, evaluation and
all. Each finished run gives, as it ran packed:
  - seconds per training iteration (its epochs' wall time over its iterations),
  - images per second of prediction (test and training images, for the tables and the fit diagnostics),
  - fixed seconds: the job's wall time less both (interpreter and CUDA start-up, data checks, building the
    model, checkpoints, evaluation).
A planned run (noisymlt.pipeline.gridplan) then costs fixed + iterations x s/iteration + images to predict /
rate, with the costs of its own method, else of its family's measured method; DivideMix also predicts its
training images twice an epoch (co-divide). k runs share the card, each at its packed speed, so the grid
takes the sum over runs / k.
"""

from __future__ import annotations

import json
from pathlib import Path

from noisymlt.errors import NoisyMLTError

# A method the check did not train costs as its family's measured method.
FAMILY_PROXY = {"single": "erm", "mlgcn": "mlgcn", "bbn": "bbn", "dividemix": "dividemix", "colearning": "ours"}


def read_benchmark_seconds(tsv: Path) -> float:
    """The wall seconds of a Snakemake job from its benchmark file (first column ``s``)."""
    lines = Path(tsv).read_text().strip().splitlines()
    if len(lines) < 2 or not lines[0].startswith("s\t"):
        raise NoisyMLTError(f"{tsv}: not a Snakemake benchmark file")
    return float(lines[-1].split("\t")[0])


def run_cost(run_dir: Path, job_seconds: float) -> dict:
    """The measured costs of one finished run (see the module doc)."""
    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    timing = json.loads((run_dir / "manifest.timing.json").read_text())
    iterations = int(manifest["iterations_per_epoch"]) * int(manifest["run"]["train"]["epochs"])
    train_s = float(sum(timing["epoch_seconds"]))
    predict_s = float(timing["predict_seconds"])
    images = int(timing["predicted_images"])
    return {"iterations": iterations, "s_per_iteration": train_s / iterations, "predict_images_per_s": images / predict_s,
            "fixed_s": max(job_seconds - train_s - predict_s, 0.0), "job_s": job_seconds,
            "device": manifest["environment"]["device"], "family": manifest["run"]["method_cfg"]["family"]}


def planned_run_seconds(job: dict, cost: dict) -> float:
    """The wall seconds of one planned run (a gridplan job) at a measured cost: a final run predicts the test
    set and its training images, a model-selection candidate its fit part and its held-out part."""
    n = job["train_images"]
    predicted = n + (job["held_out_images"] if "candidate" in job else job["test_images"])
    if job["family"] == "dividemix":  # co-divide: both nets score every training image once an epoch
        predicted += 2 * n * job["epochs"]
    return cost["fixed_s"] + job["iterations"] * cost["s_per_iteration"] + predicted / cost["predict_images_per_s"]


def grid_wall(jobs: list[dict], costs: dict[str, dict], runs_per_gpu: int) -> dict:
    """Hours of wall time for ``jobs`` on one card with ``runs_per_gpu`` runs at a time; ``costs``: method ->
    ``run_cost``."""
    seconds: dict[str, float] = {}
    by_method: dict[str, float] = {}
    unpriced = set()
    for job in jobs:
        cost = costs.get(job["method"]) or costs.get(FAMILY_PROXY.get(job["family"], ""))
        if cost is None:
            unpriced.add(job["method"])
            continue
        s = planned_run_seconds(job, cost)
        seconds[job["dataset"]] = seconds.get(job["dataset"], 0.0) + s
        by_method[job["method"]] = by_method.get(job["method"], 0.0) + s
    k = max(int(runs_per_gpu), 1)
    return {"hours": sum(seconds.values()) / k / 3600, "by_dataset": {d: s / k / 3600 for d, s in seconds.items()},
            "by_method": {m: s / k / 3600 for m, s in sorted(by_method.items())}, "runs_per_gpu": k,
            "unpriced_methods": sorted(unpriced)}
