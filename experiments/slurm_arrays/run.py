"""Does the SLURM executor plugin's job-array mode wait forever when Snakemake's `jobs` holds back ready runs?

Five ERM-like runs (erm, rs, focal, rs_focal, ldam at gamma 0.5, seed 0, one epoch on the SLURM test's tiny toy) are
ready at once; the committed SLURM profile (train as job arrays) runs them on the local cluster
(tests/slurm/start_cluster.sh) with `jobs` 2, then 10. Each run gets 150 s. Writes result.json beside this file.

    python experiments/slurm_arrays/run.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests/slurm"), str(REPO / "tests")]
import localcluster  # noqa: E402
from test_profile_slurm import DATA_TARGETS, TINY_PARAMS  # noqa: E402

METHODS = ["erm", "rs", "focal", "rs_focal", "ldam"]
LIMIT_S = 150


def attempt(jobs: int, partition: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"array_hang_jobs{jobs}_"))
    work, src = localcluster.copy_project(folder)
    layer = {key: TINY_PARAMS[key] for key in ("datasets", "train", "schedules", "pretrain")}
    layer["grid"] = {**TINY_PARAMS["grid"], "methods": METHODS}
    (folder / "layer.yaml").write_text(yaml.safe_dump(layer))
    configfiles = [work / "workflow/profiles/demo/params.yaml", folder / "layer.yaml"]
    profile = localcluster.write_local_profile(folder, work, partition, configfiles, jobs=jobs)
    snakemake = [sys.executable, "-m", "snakemake", "--nocolor"]
    inputs = [t for t in DATA_TARGETS if "select" not in t]
    localcluster.run(snakemake + ["--cores", "2", "--configfile", *map(str, configfiles), "--", *inputs], work, src, 300)
    bin_dir, calls = localcluster.sbatch_counter(folder)
    targets = [f"runs/toy/g0.5/s0/{m}/predictions.npz" for m in METHODS]
    start = time.monotonic()
    try:
        localcluster.run(snakemake + ["--profile", str(profile), "--", *targets], work, src, LIMIT_S, path=bin_dir)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
        subprocess.run(["scancel", "--user", subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()])
    done = sum((work / t).exists() for t in targets)
    return {"jobs": jobs, "ended": ended, "seconds": round(time.monotonic() - start), "runs_done": done,
            "sbatch_calls": len(calls.read_text().splitlines()) if calls.exists() else 0}


def main() -> None:
    partition, why_not = localcluster.local_partition()
    if partition is None:
        sys.exit(why_not)
    result = {"question": "does array mode wait forever when `jobs` holds back ready runs?", "ready_runs": len(METHODS),
              "limit_s": LIMIT_S, "snakemake_executor_plugin_slurm": version("snakemake-executor-plugin-slurm"),
              "attempts": [attempt(jobs, partition) for jobs in (2, 10)]}
    (HERE / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["attempts"]))


if __name__ == "__main__":
    main()
