"""The device check's ``grid_wall`` part (scripts/device_check.py): the paper grid's wall time on one card.

Every method of the paper grid trains once at paper shapes (ResNet-50 @ 224 from the 256 px cache, batch 32,
balanced 256, the precision and recipes of params.yaml) on the smoke profile's VOC stand-in, enlarged so that
a run has a few hundred iterations, through Snakemake as the packing profile runs them: ``--resources
gpu=K`` with K = that profile's runs_per_gpu, each job taking a slot of the one card. Start-up, loading,
training, prediction and evaluation are all in each job's wall time (Snakemake's benchmark file). The
measured costs then price every run the workflow plans for the paper (scripts/gridcost.py).

Without CUDA (and with --dry-run) the part plans only: the same workflow through ``snakemake -n`` with the
same resources, and the paper grid's runs; no time is measured or written.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKING_PROFILE = "workflow/profiles/h200"
DATASET, GAMMA, SEED = "voc_smoke", 0.5, 0
# Over the smoke layer: the grid's methods, paper batches, the stand-in enlarged to a few hundred iterations
# a run (VOC-MLT's recipe, scaled: about 600 long-tailed images from 2,400), a test set to predict.
GRID_LAYER = {
    "grid": {"datasets": [DATASET], "gammas": [GAMMA], "seeds": [SEED], "ablations": []},
    "datasets": {DATASET: {"toy": {"seed": 0, "n_trainval": 2400, "n_test": 500, "size": 64},
                           "longtail": {"source": "pareto", "b": 6, "max": 300, "min": 4, "seed": 0,
                                        "cap_to_available": True}}},
    "train": {"batch_size": 32, "balanced_batch_size": 256, "max_iters_per_epoch": 25},
    "selection": {"enabled": False},
}
KEYS = ["runs_per_gpu", "methods", "dry_run", "planned_jobs", "runs", "mini_grid_wall_s", "train_span_s", "sum_job_s",
        "packing_efficiency", "grid_runs", "grid_wall", "grid_wall_reason"]


def profile_runs_per_gpu(profile: str = PACKING_PROFILE) -> int:
    """k of the packing profile: its train rule's runs_per_gpu (set-resources)."""
    import yaml

    config = yaml.safe_load((REPO / profile / "config.yaml").read_text())
    return int(config["set-resources"]["train"]["runs_per_gpu"])


# What a workflow's folder keeps in OUT: records and logs, never checkpoints, caches or images (OUT travels back
# from a GPU machine, where ResNet-50 checkpoints would be gigabytes).
KEEP = ["runs/**/manifest.json", "runs/**/manifest.timing.json", "runs/**/map.json", "runs/**/metrics.json",
        "runs/**/train_log.jsonl", "benchmarks/**/*.tsv", "logs/**/*.log", "*.yaml"]


def keep_records(work: Path, keep: Path, patterns: list[str] = KEEP) -> None:
    """Copy the records and logs of the workflow folder ``work`` into ``keep`` (``patterns``, default KEEP)."""
    for pattern in patterns:
        for f in work.glob(pattern):
            if f.is_file() and f.stat().st_size < 2**20:
                (keep / f.relative_to(work)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, keep / f.relative_to(work))


def copy_workflow(work: Path) -> Path:
    """The workflow's files in ``work``: params.yaml, the root Snakefile, its default profile and workflow/."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "params.yaml", work / "params.yaml")
    shutil.copy2(REPO / "Snakefile", work / "Snakefile")
    shutil.copytree(REPO / "profiles", work / "profiles")
    shutil.copytree(REPO / "workflow", work / "workflow")
    return work


def workdir(base: Path, methods: list[str]) -> tuple[Path, Path]:
    """A copy of the workflow in ``base`` and the layer file for it."""
    import yaml

    work = copy_workflow(Path(base))
    layer = work / "grid_wall.yaml"
    block = json.loads(json.dumps(GRID_LAYER))
    block["grid"]["methods"] = methods
    layer.write_text(yaml.safe_dump(block, sort_keys=False))
    return work, layer


def snakemake_cmd(layer: Path, k: int, cores: int, dry: bool, methods: list[str]) -> list[str]:
    """The packed workflow up to each method's evaluated run (no report steps); targets first (a target after
    --resources is read as a resource)."""
    from noisymlt.pipeline import layout as L

    threads = max(1, cores // k)
    targets = [L.fill(L.RUN, dataset=DATASET, gamma=GAMMA, seed=SEED, method=m) + "/metrics.json" for m in methods]
    return [sys.executable, "-m", "snakemake", *targets, "--profile", "workflow/profiles/smoke", "--configfile",
            "workflow/profiles/smoke/params.yaml", str(layer), "--resources", f"gpu={k}",
            "--set-resources", f"train:runs_per_gpu={k}", "--set-threads", f"train={threads}",
            "--cores", str(max(cores, k)), *(["-n", "--quiet", "rules"] if dry else [])]


def planned_train_jobs(log_text: str) -> int:
    """The train jobs of a ``snakemake -n --quiet rules`` summary (its job-count table)."""
    for line in log_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "train" and parts[1].isdigit():
            return int(parts[1])
    return 0


def measured_costs(work: Path, methods: list[str]) -> tuple[dict, float, float]:
    """(method -> run_cost, the jobs' summed seconds, the seconds from the first run's start to the last run's
    end: the packed training phase, without the data steps before it)."""
    import datetime as dt

    from noisymlt.pipeline import layout as L
    from gridcost import read_benchmark_seconds, run_cost

    costs, starts, ends = {}, [], []
    for m in methods:
        run = work / L.fill(L.RUN, dataset=DATASET, gamma=GAMMA, seed=SEED, method=m)
        bench = work / "benchmarks" / "train" / f"{DATASET}_g{GAMMA}_s{SEED}_{m}.tsv"
        costs[m] = run_cost(run, read_benchmark_seconds(bench))
        timing = json.loads((run / "manifest.timing.json").read_text())
        starts.append(dt.datetime.fromisoformat(timing["started"]))
        ends.append(dt.datetime.fromisoformat(timing["finished"]))
    return costs, sum(c["job_s"] for c in costs.values()), (max(ends) - min(starts)).total_seconds()


def grid_wall_part(ctx: dict, run_logged) -> dict:
    """The part's record (KEYS); ``run_logged`` is device_check's command runner. The workflow runs in a
    temporary folder; its records and logs are kept in OUT/grid_wall."""
    from noisymlt.config import load_params

    params = load_params(REPO / "params.yaml")
    # a clean-then-retrain method trains its `of` method's recipe: priced as that one (gridcost.FAMILY_PROXY by family)
    methods = [m for m in params["grid"]["methods"] if not params["methods"][m].get("clean")]
    k = profile_runs_per_gpu()
    dry = ctx["dry_run"] or ctx["device"] != "cuda"
    work, layer = workdir(Path(tempfile.mkdtemp(prefix="device_check_grid_")), methods)
    try:
        return measure(ctx, run_logged, params, methods, k, dry, work, layer)
    finally:
        keep_records(work, ctx["out"] / "grid_wall")
        shutil.rmtree(work, ignore_errors=True)


def measure(ctx: dict, run_logged, params: dict, methods: list[str], k: int, dry: bool, work: Path,
            layer: Path) -> dict:
    import yaml

    import gridcost

    log_path = ctx["out"] / "logs" / "grid_wall.log"
    cmd = snakemake_cmd(layer, k, ctx["cores"], dry, methods)
    t0 = time.monotonic()
    run_logged(cmd, log_path, min(ctx["budget"].left(), 60 if dry else 330), ctx["env"], cwd=work)
    wall = time.monotonic() - t0
    record = dict.fromkeys(KEYS)
    record.update(runs_per_gpu=k, methods=methods, dry_run=dry)
    jobs = gridcost.plan_grid(params, data_root=REPO / "data")
    record["grid_runs"] = len(jobs)
    if dry:
        record["planned_jobs"] = planned_train_jobs(log_path.read_text())
        if record["planned_jobs"] != len(methods):
            raise RuntimeError(f"the packed workflow plans {record['planned_jobs']} train jobs, expected "
                               f"{len(methods)} (log: {log_path})")
        record["grid_wall_reason"] = "dry run: planned only" if ctx["dry_run"] else "no CUDA device: planned only"
        return record
    costs, sum_job_s, train_span = measured_costs(work, methods)
    record.update(runs=costs, mini_grid_wall_s=wall, train_span_s=train_span, sum_job_s=sum_job_s,
                  packing_efficiency=sum_job_s / k / train_span if train_span else None)
    record["grid_wall"] = gridcost.grid_wall(jobs, costs, k)
    # the measured runs kept the card's k slots this full: the grid, packed alike, takes sum / k / that
    eff = min(record["packing_efficiency"] or 1.0, 1.0)
    record["grid_wall"]["hours_at_measured_packing"] = record["grid_wall"]["hours"] / eff
    (ctx["out"] / "grid_wall.json").write_text(json.dumps({**record, "layer": yaml.safe_load(layer.read_text())},
                                                          indent=1) + "\n")
    return record


def summary_lines(gw: dict) -> list[str]:
    """The grid_wall lines of device_check.md."""
    if not gw.get("grid_runs"):
        return []
    if not gw.get("grid_wall"):
        return ["", f"Grid wall time: not measured ({gw.get('grid_wall_reason')}); the packed workflow of "
                f"{len(gw['methods'])} methods, {gw['runs_per_gpu']} runs per card, planned "
                f"{gw.get('planned_jobs')} train jobs; the paper grid plans {gw['grid_runs']} runs."]
    g = gw["grid_wall"]
    lines = ["", f"Grid wall time on one card, {gw['runs_per_gpu']} runs per card (the packing profile): "
             f"**{g['hours']:.2f} h** for the paper grid's {gw['grid_runs']} runs ("
             + ", ".join(f"{d} {h:.2f} h" for d, h in g["by_dataset"].items()) + "). "
             f"Measured: every grid method once at paper shapes on the smoke stand-in through Snakemake, "
             f"{gw['mini_grid_wall_s']:.0f} s for the packed workflow with its data steps, {gw['train_span_s']:.0f} s "
             f"from the first run's start to the last run's end ({gw['sum_job_s']:.0f} job-seconds / "
             f"{gw['runs_per_gpu']} = {gw['packing_efficiency']:.2f} of that span; at that packing the grid takes "
             f"{g['hours_at_measured_packing']:.2f} h).", "",
             "| method | device | iterations | s/iteration | predict img/s | fixed s | job s |",
             "|---|---|---|---|---|---|---|"]
    for m, c in gw["runs"].items():
        lines.append(f"| {m} | {c['device']} | {c['iterations']} | {c['s_per_iteration']:.4f} | "
                     f"{c['predict_images_per_s']:.0f} | {c['fixed_s']:.1f} | {c['job_s']:.1f} |")
    if g["unpriced_methods"]:
        lines.append(f"Not priced (no measured method of their family): {', '.join(g['unpriced_methods'])}.")
    return lines
