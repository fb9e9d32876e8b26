"""The SLURM profile, for real: the toy workflow's training and report steps submitted with sbatch.

Needs a SLURM cluster on this machine (CI starts a single-node one with
tests/slurm/start_cluster.sh); skipped when `sbatch` is missing, `sinfo` does not answer or this
host is not a usable node of the default partition. The workflow files and the real
workflow/profiles/slurm profile are copied into a temporary folder; a test profile is derived from
that profile with only what a 2-core, GPU-less, accounting-free node needs changed (see
`derive_test_profile`), and a params layer shrinks the demo to one tiny run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600

# One run (toy, gamma 0.5, seed 0, ERM) on 32 px images, one epoch. 600 trainval images with
# max 110 give a 200-image long-tailed subset with 1 head, 4 medium and 15 tail classes.
TINY_PARAMS = {
    "grid": {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"], "ablations": [], "clean_methods": []},
    "datasets": {
        "toy": {
            "toy": {"seed": 0, "n_trainval": 600, "n_test": 200, "size": 32, "scenes": "glyph"},
            "longtail": {"source": "pareto", "b": 6, "max": 110, "min": 2, "seed": 0, "groups": "fixed"},
        }
    },
    "train": {"image_size": 32, "epochs": 1, "warmup_iters": 2, "lr_steps": [], "eval_batch_size": 100},
    # a schedule's keys win over the train block: the demo's recipes set their own epochs
    "schedules": {name: {"train": {"warmup_iters": 2, "epochs": 1, "lr_steps": []}}
                  for name in ("db", "db_random")},
    # the demo's pretrained backbone, made in seconds: a small source task, one epoch
    "pretrain": {"toy_glyphs": {"epochs": 1, "source": {"classes": 8, "images_per_class": 16, "held_out_per_class": 4}}},
    # model selection of ERM's lr over two candidates, each its own sbatch job (group `select`), on the grid's one
    # noisy set (the demo selects on two)
    "selection": {"methods": {"erm": [["lr"]]}, "grids": {"lr": [0.02, 0.08]}, "seeds": [0]},
}

# Each rule run through SLURM costs Snakemake start-ups (sbatch -> jobstep, then srun -> one per
# rule), about 15 s per rule here. So the cheap data steps run locally first, and the SLURM run does
# the rest: the selection's two candidates (one array job), the final run (train, which evaluates its
# predictions) and the profile's `report` group (aggregate, table, figure).
DATA_TARGETS = ["data/toy/noisy/g0.5_s0.parquet", "data/toy/test_labels.parquet", "data/toy/class_split.json",
                "data/pretrained/toy_glyphs.pt", "data/code",  # data/code: DVC's digests (`rule all` asks for them)
                "data/toy/select/g0.5_s0_fit.parquet", "data/toy/cache/select_fit.npy", "data/toy/cache/select_val.npy"]
SLURM_GROUPS = {"report": ["aggregate", "figure_map_vs_gamma", "table_total"]}
GROUP_JOBS = {"report": 1}  # sbatch jobs per group
ARRAY_RULES = {"train", "train_candidate"}  # the profile's slurm-array-jobs
# one sbatch job each
SLURM_SINGLE_RULES = {"cache_train_images", "cache_test_images", "readme_numbers", "table_groups", "table_fit"}


def local_partition() -> str:
    """The default partition, if this machine is one of its nodes and up; else skip.

    Only a cluster on this machine is used: on a real cluster's login node the test's tmp folder
    would not be on the compute nodes' file system.
    """
    if shutil.which("sbatch") is None:
        pytest.skip("no SLURM: sbatch not found (CI starts one with tests/slurm/start_cluster.sh)")
    try:
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %P %t"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no SLURM: sinfo does not answer ({exc})")
    if out.returncode != 0:
        pytest.skip(f"no SLURM: sinfo failed: {out.stderr.strip()}")
    host = socket.gethostname().split(".")[0]
    for line in out.stdout.splitlines():
        node, partition, state = line.split()
        if node == host and partition.endswith("*") and state.rstrip("*") in {"idle", "mix", "alloc", "comp"}:
            return partition.rstrip("*")
    pytest.skip(f"no usable local SLURM node {host!r} in the default partition: sinfo says {out.stdout!r}")


def derive_test_profile(profile: dict, partition: str, configfiles: list[Path]) -> dict:
    """The real profile, changed only where the local test node differs from a GPU cluster."""
    p = dict(profile)
    p["configfile"] = [str(f) for f in configfiles]
    p["retries"] = 0                      # a failure should fail the test at once
    # No slurmdbd: poll with squeue, submit without an account, and poll early (short jobs).
    p["slurm-no-account"] = True
    p["slurm-status-command"] = "squeue"
    p["slurm-init-seconds-before-status-checks"] = 2
    p["slurm-keep-successful-logs"] = True  # evidence that every job went through sbatch
    p["set-threads"] = {**p.get("set-threads", {}), "train": 1, "train_candidate": 1}
    default = dict(p["default-resources"], slurm_partition=partition, mem_mb=1000)
    p["default-resources"] = default
    res = {rule: dict(r) for rule, r in p["set-resources"].items()}
    for r in res.values():
        if "slurm_partition" in r:
            r["slurm_partition"] = partition
        if "mem_mb" in r:
            r["mem_mb"] = 1000
    for rule in ("train", "train_candidate"):
        for key in ("gpu_model", "gres"):
            res[rule].pop(key, None)
        res[rule]["gpu"] = 0              # no GPU on the test node: no --gpus on sbatch
    p["set-resources"] = res
    return p


def snakemake_env(src: Path) -> dict:
    """The jobs inherit this environment (sbatch --export=ALL): `python -m noisymlt` imports from src."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH", "")]))
    for var in [v for v in env if v.startswith("SLURM_")]:
        del env[var]                      # a test run inside an allocation must not leak its job id
    return env


def run(cmd: list[str], cwd: Path, src: Path, timeout: int, path: Path | None = None) -> str:
    env = snakemake_env(src)
    if path:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


def copy_project(tmp_path: Path) -> tuple[Path, Path]:
    """The workflow files in tmp_path/wf and a snapshot of the package in tmp_path/src (its code digest is a rule
    param, so an edit of src/ during the test would otherwise make the SLURM run redo the data steps)."""
    work = tmp_path / "wf"
    work.mkdir()
    for name in ("params.yaml", "Snakefile"):
        shutil.copy2(ROOT / name, work)
    shutil.copytree(ROOT / "profiles", work / "profiles")  # the default profile, beside the Snakefile
    shutil.copytree(ROOT / "workflow", work / "workflow")  # follows the schema symlink
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src/noisymlt", src / "noisymlt", ignore=shutil.ignore_patterns("__pycache__"))
    return work, src


def write_test_profile(tmp_path: Path, work: Path, partition: str, configfiles: list[Path], **changes) -> Path:
    real = yaml.safe_load((work / "workflow/profiles/slurm/config.yaml").read_text())
    assert real["executor"] == "slurm" and real["set-resources"]["train"]["gpu"] == 1
    assert real["set-resources"]["train_candidate"]["gpu"] == 1
    prof_dir = tmp_path / "profile"
    prof_dir.mkdir()
    (prof_dir / "config.yaml").write_text(yaml.safe_dump({**derive_test_profile(real, partition, configfiles),
                                                          **changes}))
    return prof_dir


def sbatch_counter(tmp_path: Path) -> tuple[Path, Path]:
    """A folder to put first on PATH whose `sbatch` records each call (one line) and runs the real one."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch_calls.txt"
    bin_dir.mkdir()
    shim = bin_dir / "sbatch"
    shim.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec {shutil.which('sbatch')} \"$@\"\n")
    shim.chmod(0o755)
    return bin_dir, calls


def test_slurm_profile_runs_the_toy_workflow_through_sbatch(tmp_path: Path) -> None:
    partition = local_partition()
    work, src = copy_project(tmp_path)
    tiny = tmp_path / "tiny_params.yaml"
    tiny.write_text(yaml.safe_dump(TINY_PARAMS))
    configfiles = [work / "workflow/profiles/demo/params.yaml", tiny]
    prof_dir = write_test_profile(tmp_path, work, partition, configfiles)
    bin_dir, calls = sbatch_counter(tmp_path)

    snakemake = [sys.executable, "-m", "snakemake", "--nocolor"]
    run(snakemake + ["--cores", "2", "--configfile", *map(str, configfiles), "--", *DATA_TARGETS], work, src, 120)
    log = run(snakemake + ["--profile", str(prof_dir)], work, src, RUN_TIMEOUT_S, path=bin_dir)
    assert re.search(r"(\d+) of \1 steps \(100%\) done", log), log[-3000:]

    # The outputs of the whole chain.
    table = (work / "reports/table_total.tex").read_text()
    assert "\\begin{tabular}" in table and "Toy-MLT-Noise" in table
    erm = re.search(r"^ERM & (?:\\textbf\{)?([0-9.]+)", table, re.M)
    assert erm and 0 < float(erm.group(1)) <= 100, table
    results = pd.read_parquet(work / "reports/results.parquet")
    assert set(results["dataset"]) == {"toy"} and set(results["gamma"]) == {0.5}
    assert results["run_id"].nunique() == 1
    assert (work / "reports/map_vs_gamma.png").stat().st_size > 0
    split = json.loads((work / "data/toy/class_split.json").read_text())
    assert [len(split[g]) for g in ("head", "medium", "tail")] == [1, 4, 15]

    # The report group was one sbatch job, the two candidates one array (two tasks, one sbatch call), the final run
    # a job of its own (an array of one is a plain job); every other rule one job each. Logs kept.
    slurm_logs = work / ".snakemake/slurm_logs"
    assert sorted(d.name for d in slurm_logs.iterdir()) == sorted(
        [f"group_{name}_{'_'.join(rules)}" for name, rules in SLURM_GROUPS.items()]
        + [f"rule_{rule}" for rule in {*SLURM_SINGLE_RULES, *ARRAY_RULES}]
    )
    group_logs = {name: sorted((slurm_logs / f"group_{name}_{'_'.join(rules)}").rglob("*.log"))
                  for name, rules in SLURM_GROUPS.items()}
    assert {name: len(files) for name, files in group_logs.items()} == GROUP_JOBS
    candidates = sorted((slurm_logs / "rule_train_candidate").glob("*.log"))
    assert len(candidates) == 2 and len({f.stem.split("_")[0] for f in candidates}) == 1, candidates  # <array>_<task>
    submitted = calls.read_text().splitlines()
    assert len(submitted) == len(SLURM_GROUPS) + len(SLURM_SINGLE_RULES) + len(ARRAY_RULES), submitted
    assert [c for c in submitted if "--array=" in c] == [c for c in submitted if "train_candidate" in c]
    assert len([c for c in submitted if "train_candidate" in c]) == 1
    assert all("--requeue" in c for c in submitted)  # a preempted job comes back
    chosen = json.loads((work / "runs/toy/select/erm/stage1.json").read_text())
    assert [c["tag"] for c in chosen["candidates"]] == ["lr0.02", "lr0.08"]
    assert json.loads((work / "runs/toy/g0.5/s0/erm/run_config.json").read_text())["train"]["lr"] == chosen["chosen"]["lr"]
    manifest = json.loads((work / "runs/toy/g0.5/s0/erm/manifest.json").read_text())
    timing = json.loads((work / "runs/toy/g0.5/s0/erm/manifest.timing.json").read_text())  # untracked: varies per job
    job_id = timing["slurm_job_id"]
    assert job_id is not None and job_id.isdigit(), timing
    train_log = slurm_logs / "rule_train" / f"{job_id}.log"
    assert "localrule train:" in train_log.read_text()
    assert manifest["environment"]["device"] == "cpu"
