"""What the paper grid costs, for the device check and the SLURM requests (scripts/device_check.py,
scripts/device_grid.py, scripts/slurm_requests.py): every run the workflow plans, the training iterations of each,
the GPU-hours they take at measured step costs, and the wall time on one card from measured runs.

Iterations come from the code that plans training, never from a second formula: each run's method
builds its data streams (samplers over the run's noisy labels) and ``noisymlt.training.schedule.epoch_iterations``
turns them into the epoch length the trainer uses. The noisy labels are the pipeline's own
``data/<dataset>/noisy/g<gamma>_s<seed>.parquet`` when they exist; otherwise a synthetic table with the
published subset's size and per-class counts is made noisy with the run's (gamma, seed) by
``noisymlt.data.noise.inject_noise``. Only the class-aware epoch ([DB] recipe) reads the labels, through the
largest noisy class count, which the synthetic co-occurrences approximate.

The wall time (the GPU check's ``grid_wall`` part, ``grid_wall``): the check trains every grid method at paper
shapes on the smoke stand-in through the workflow, k runs at a time on one card as the packing profile runs them
(``runs_per_gpu``), start-up, loading, evaluation and all. Each finished run gives, as it ran packed:
  - seconds per training iteration (its epochs' wall time over its iterations),
  - images per second of prediction (test and training images, for the tables and the fit diagnostics),
  - fixed seconds: the job's wall time less both (interpreter and CUDA start-up, data checks, building the
    model, checkpoints, evaluation).
A planned run then costs fixed + iterations x s/iteration + images to predict / rate, with the costs of its own
method, else of its family's proxy (``FAMILY_PROXY``); DivideMix also predicts its training images twice an epoch
(co-divide). k runs share the card, each at its packed speed, so the grid takes the sum over runs / k.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.data.noise_models import PAPER

# The clean per-class counts of a published long-tailed subset are the dataset kinds' (noisymlt.data.kinds:
# published_subset), in the project's class order.

# The measured method that stands for a family's runs where the method itself was not measured (the throughput part
# measures the paper's five methods; the grid_wall part every grid method). ML-GCN's GCN over 20-80 class nodes is
# negligible next to the backbone, so its runs cost what ERM's do.
FAMILY_PROXY = {"single": "erm", "mlgcn": "erm", "bbn": "bbn", "dividemix": "dividemix", "colearning": "ours"}


def synthetic_labels(images: int, counts: list[int], seed: int = 0) -> np.ndarray:
    """An (images x C) 0/1 table with exactly ``counts`` positives per class and at least one per image;
    which images share classes is random."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.max() > images or counts.sum() < images:
        raise NoisyMLTError(f"class counts {counts.tolist()} cannot fill {images} images "
                            "(each class at most once per image, each image at least one class)")
    rng = np.random.default_rng(seed)
    y = np.zeros((images, counts.size), dtype=np.uint8)
    pool = rng.permutation(np.repeat(np.arange(counts.size), counts))
    y[np.arange(images), pool[:images]] = 1  # one positive per image first
    for c, rest in zip(*np.unique(pool[images:], return_counts=True)):
        free = np.flatnonzero(y[:, c] == 0)
        y[rng.choice(free, size=rest, replace=False), c] = 1
    return y


def planned_noisy_labels(params: dict, dataset: str, gamma: float, seed: int, data_root: str | Path = "data",
                         noise: str = PAPER) -> tuple[np.ndarray, dict, str]:
    """(noisy labels, class split, where they came from) for one (dataset, gamma, seed, noise model) of the grid.
    Without the file, a model that reads settings of its own (a matrix) is planned with the paper's model: only the
    noisy class counts matter here (the class-aware epoch), and the source says so."""
    from noisymlt.data.kinds import dataset_kind
    from noisymlt.data.labels import read_class_split, read_labels, split_from_counts
    from noisymlt.data.noise import inject_noise
    from noisymlt.data.noise_models import noise_model
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline.paths import dataset_block

    def under_root(path: str) -> Path:  # a file of the layout's data folder, under data_root instead
        return Path(data_root, *Path(path).parts[1:])

    noisy_file = under_root(L.fill(L.NOISY, dataset=dataset, gamma=gamma, seed=seed, noise=noise))
    split_file = under_root(L.fill(L.CLASS_SPLIT, dataset=dataset))
    if noisy_file.is_file() and split_file.is_file():
        return read_labels(noisy_file).labels, read_class_split(split_file), str(noisy_file)
    kind = dataset_kind(dataset_block(params, dataset))
    subset = kind.published_subset
    if subset is None:
        raise NoisyMLTError(f"{noisy_file}: missing, and dataset {dataset!r} (kind {kind.name}) has no published "
                            "class counts to plan from: run its data steps first (noise for every gamma and seed)")
    clean = synthetic_labels(subset["images"], subset["counts"])
    drawn = PAPER if noise_model(noise).options else noise
    noisy, _ = inject_noise(clean, gamma, seed, drawn)
    return noisy, split_from_counts(np.asarray(subset["counts"])), (
        f"synthetic {kind.name} (published class counts{'' if drawn == noise else ', the paper noise model'})")


def planned_test_images(params: dict, dataset: str, data_root: str | Path = "data") -> int:
    """The images a final run of ``dataset`` predicts: its kind's test set where the kind fixes it, else the test
    table's rows."""
    from noisymlt.data.kinds import dataset_kind
    from noisymlt.data.labels import read_labels
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline.paths import dataset_block

    known = dataset_kind(dataset_block(params, dataset)).test_images
    if known is not None:
        return known
    test = Path(data_root, *Path(L.fill(L.TEST_LABELS, dataset=dataset)).parts[1:])
    if not test.is_file():
        raise NoisyMLTError(f"{test}: missing, and dataset {dataset!r} has no known test size: run its parse step "
                            "first")
    return len(read_labels(test))


def run_iterations(resolved: dict, noisy: np.ndarray, split: dict) -> dict:
    """Training iterations of one run, planned as the trainer plans them: the method's streams over the
    noisy labels, ``epoch_iterations`` of the run's epoch-length rule, ``train.epochs`` epochs."""
    import torch

    from noisymlt.methods import load_family
    from noisymlt.methods.base import TrainContext
    from noisymlt.training.schedule import epoch_iterations

    tcfg = resolved["train"]
    family = resolved["method_cfg"]["family"]
    labels = torch.as_tensor(np.asarray(noisy), dtype=torch.float32)
    ctx = TrainContext(resolved, labels, split, torch.device("cpu"), 0, extra={})
    streams = load_family(family)(ctx).streams()
    per_epoch = epoch_iterations(tcfg.get("epoch_length", "batches"), streams, labels.shape[0], tcfg["batch_size"])
    return {"family": family, "iterations_per_epoch": per_epoch, "epochs": int(tcfg["epochs"]),
            "iterations": per_epoch * int(tcfg["epochs"]),
            "images_per_step": sum(s.batch_size * s.k for s in streams)}


def plan_grid(params: dict, data_root: str | Path = "data") -> list[dict]:
    """One record per run the workflow trains: the model-selection candidates of the methods that select
    (params `selection`; ``candidate`` names them), the cross-fitting's fold runs (params `crossfit`; ``crossfit``
    names them), then the main grid and the selected ablations. Each
    has its key, its iterations, its training (and held-out) images and where its labels came from; a
    candidate's iterations are those of its fit part (the training images less the held-out split)."""
    from noisymlt.pipeline import selection
    from noisymlt.config import resolve_run
    from noisymlt.pipeline.paths import all_runs

    labels: dict[tuple, tuple] = {}

    def noisy_of(dataset, gamma, seed, noise=PAPER):
        if (dataset, gamma, seed, noise) not in labels:
            labels[dataset, gamma, seed, noise] = planned_noisy_labels(params, dataset, gamma, seed, data_root, noise)
        return labels[dataset, gamma, seed, noise]

    test_sizes: dict[str, int] = {}  # a dataset's test table is read once, not once a run

    def test_of(dataset):
        if dataset not in test_sizes:
            test_sizes[dataset] = planned_test_images(params, dataset, data_root)
        return test_sizes[dataset]

    runs = all_runs(params)
    jobs = []
    for dataset in dict.fromkeys(r[0] for r in runs):
        owners = selection.selecting_methods(params, [r.method for r in runs if r.dataset == dataset])
        if not owners:
            continue
        sets = selection.selection_sets(params)
        block = params["selection"]
        tables = [noisy_of(dataset, gamma, seed) for gamma, seed in sets]
        val, _ = selection.stratified_split([t[0] for t in tables], float(block["held_out"]), int(block["split_seed"]))
        for method in owners:
            for stage in range(1, len(selection.stages(params, method)) + 1):
                for tag, values in selection.candidates(params, method, stage):
                    for (gamma, seed), (noisy, split, source) in zip(sets, tables):
                        cfg = resolve_run(params, dataset, method, gamma, seed, chosen=values, candidate=True)
                        jobs.append({"dataset": dataset, "gamma": gamma, "seed": seed, "method": method,
                                     "candidate": f"stage{stage}/{tag}", "labels": f"{source}, fit part",
                                     "test_images": test_of(dataset),
                                     "train_images": int((~val).sum()), "held_out_images": int(val.sum()),
                                     **run_iterations(cfg, noisy[~val], split)})
    from noisymlt.config import fold_run
    from noisymlt.data.splits import iterative_folds
    from noisymlt.pipeline.paths import crossfit_levels

    for dataset in dict.fromkeys(r[0] for r in runs):  # the cross-fitting's fold runs (params crossfit)
        levels = crossfit_levels(params, dataset)
        if not levels:
            continue
        folds, method = int(params["crossfit"]["folds"]), params["crossfit"]["method"]
        tables = [noisy_of(dataset, gamma, seed, noise) for noise, gamma, seed in levels]
        fold = iterative_folds(np.hstack([t[0] > 0.5 for t in tables]), [1.0 / folds] * folds,
                               int(params["crossfit"]["seed"]))
        for (noise, gamma, seed), (noisy, split, source) in zip(levels, tables):
            for k in range(folds):
                cfg = fold_run(params, dataset, method, gamma, seed, k, None, noise)
                jobs.append({"dataset": dataset, "gamma": gamma, "seed": seed, "method": method,
                             "crossfit": f"fold{k}", "labels": f"{source}, all folds but {k}",
                             "test_images": test_of(dataset), "train_images": int((fold != k).sum()),
                             "held_out_images": int((fold == k).sum()), **run_iterations(cfg, noisy[fold != k], split)})
    for dataset, gamma, seed, method, noise in runs:
        noisy, split, source = noisy_of(dataset, gamma, seed, noise)
        cfg = resolve_run(params, dataset, method, gamma, seed, noise=noise)
        extra = {} if noise == PAPER else {"noise": noise}  # the paper grid's records keep their keys
        jobs.append({"dataset": dataset, "gamma": gamma, "seed": seed, "method": method, **extra, "labels": source,
                     "test_images": test_of(dataset), "train_images": int(len(noisy)),
                     "held_out_images": 0, **run_iterations(cfg, noisy, split)})
    return jobs


def gpu_hours(jobs: list[dict], measured: dict[str, dict], packing_speedup: float | None = None) -> dict:
    """Device-hours of the planned steps at measured costs. ``measured``: method -> a throughput row
    (``ms_per_step``, ``train_images_per_step``); a run costs its family proxy's time per training
    image times its own images per step. With ``packing_speedup`` (aggregate throughput of concurrent
    runs over one run's), also the hours with runs packed side by side. Training steps only: data
    loading stalls, DivideMix's per-epoch co-divide passes and test-set prediction are not included."""
    per_image = {m: r["ms_per_step"] / r["train_images_per_step"] for m, r in measured.items()}
    hours: dict[str, float] = {}
    unpriced = []
    for job in jobs:
        proxy = FAMILY_PROXY.get(job["family"])
        if proxy not in per_image:
            unpriced.append(job["method"])
            continue
        ms = job["iterations"] * job["images_per_step"] * per_image[proxy]
        hours[job["dataset"]] = hours.get(job["dataset"], 0.0) + ms / 3.6e6
    total = sum(hours.values())
    return {"by_dataset": hours, "total": total,
            "packed_total": total / packing_speedup if packing_speedup else None,
            "unpriced_methods": sorted(set(unpriced))}


def summarise(jobs: list[dict]) -> dict:
    """Counts of the plan: runs (model-selection candidates among them) and iterations per dataset and per
    method."""
    out: dict = {"runs": len(jobs), "candidates": sum("candidate" in j for j in jobs),
                 "crossfit_runs": sum("crossfit" in j for j in jobs),
                 "iterations": sum(j["iterations"] for j in jobs), "by_dataset": {}, "by_method": {}}
    for job in jobs:
        for group, key in (("by_dataset", job["dataset"]), ("by_method", job["method"])):
            slot = out[group].setdefault(key, {"runs": 0, "iterations": 0})
            slot["runs"] += 1
            slot["iterations"] += job["iterations"]
    return out


# ------------------------------------------------------------------ wall time on one card, from measured runs
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
    """The wall seconds of one planned run (a plan_grid job) at a measured cost: a final run predicts the test
    set and its training images, a model-selection candidate or a cross-fitting run its training part and the
    part it holds out."""
    n = job["train_images"]
    predicted = n + (job["held_out_images"] if "candidate" in job or "crossfit" in job else job["test_images"])
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
