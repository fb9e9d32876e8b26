"""The SLURM profile on the single-node cluster of this machine (start_cluster.sh): a copy of the project, the real
profile changed only where the local node differs from a GPU cluster, and sbatch calls counted.

Shared by tests/test_profile_slurm.py and scripts/slurm_submissions.py (which measures how many sbatch calls a grid takes).
Only a cluster on this machine is used: on a real cluster's login node a temporary folder would not be on the
compute nodes' file system.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def local_partition() -> tuple[str | None, str]:
    """(the default partition, '') when this machine is an up node of it; else (None, why not)."""
    if shutil.which("sbatch") is None:
        return None, "no SLURM: sbatch not found (CI starts one with tests/slurm/start_cluster.sh)"
    try:
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %P %t"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"no SLURM: sinfo does not answer ({exc})"
    if out.returncode != 0:
        return None, f"no SLURM: sinfo failed: {out.stderr.strip()}"
    host = socket.gethostname().split(".")[0]
    for line in out.stdout.splitlines():
        node, partition, state = line.split()
        if node == host and partition.endswith("*") and state.rstrip("*") in {"idle", "mix", "alloc", "comp"}:
            return partition.rstrip("*"), ""
    return None, f"no usable local SLURM node {host!r} in the default partition: sinfo says {out.stdout!r}"


def local_rules(root: Path = ROOT) -> set[str]:
    """The rules the workflow's `localrules:` blocks name: they run in the snakemake process, never through sbatch."""
    texts = [f.read_text() for f in sorted((root / "workflow/rules").glob("*.smk"))]
    return {name for text in texts for block in re.findall(r"^localrules:\n((?:    \w+,?\n)+)", text, re.M)
            for name in re.findall(r"\w+", block)}


def derive_local_profile(profile: dict, partition: str, configfiles: list[Path]) -> dict:
    """The real profile, changed only where the local test node differs from a GPU cluster."""
    p = dict(profile)
    p["configfile"] = [str(f) for f in configfiles]
    p["retries"] = 0                      # a failure should fail at once
    # No slurmdbd: poll with squeue, submit without an account, and poll early (short jobs).
    p["slurm-no-account"] = True
    p["slurm-status-command"] = "squeue"
    p["slurm-init-seconds-before-status-checks"] = 2
    p["slurm-keep-successful-logs"] = True  # evidence that every job went through sbatch
    p["set-threads"] = {**p.get("set-threads", {}), "train": 1, "train_candidate": 1}
    p["default-resources"] = dict(p["default-resources"], slurm_partition=partition, mem_mb=1000)
    res = {rule: dict(r) for rule, r in p["set-resources"].items()}
    for r in res.values():
        if "slurm_partition" in r:
            r["slurm_partition"] = partition
        if "mem_mb" in r:
            r["mem_mb"] = 1000
        if "gpu" in r:                    # the steps train on the CPU here: no --gpus on sbatch
            for key in ("gpu_model", "gres"):
                r.pop(key, None)
            r["gpu"] = 0
    p["set-resources"] = res
    return p


def write_local_profile(folder: Path, work: Path, partition: str, configfiles: list[Path], **changes) -> Path:
    """The project copy's SLURM profile for this node, with `changes` on top, as folder/profile/config.yaml."""
    real = yaml.safe_load((work / "workflow/profiles/slurm/config.yaml").read_text())
    prof_dir = folder / "profile"
    prof_dir.mkdir()
    (prof_dir / "config.yaml").write_text(yaml.safe_dump({**derive_local_profile(real, partition, configfiles),
                                                          **changes}))
    return prof_dir


def copy_project(folder: Path) -> tuple[Path, Path]:
    """The workflow files in folder/wf and a snapshot of the package in folder/src (its code digest is a rule
    param, so an edit of src/ meanwhile would otherwise make the SLURM run redo the data steps)."""
    work = folder / "wf"
    work.mkdir()
    for name in ("params.yaml", "Snakefile"):
        shutil.copy2(ROOT / name, work)
    shutil.copytree(ROOT / "profiles", work / "profiles")  # the default profile, beside the Snakefile
    shutil.copytree(ROOT / "workflow", work / "workflow")  # follows the schema symlink
    src = folder / "src"
    shutil.copytree(ROOT / "src/noisymlt", src / "noisymlt", ignore=shutil.ignore_patterns("__pycache__"))
    return work, src


def sbatch_counter(folder: Path) -> tuple[Path, Path]:
    """A folder to put first on PATH whose `sbatch` records each call (one line) and runs the real one."""
    bin_dir, calls = folder / "bin", folder / "sbatch_calls.txt"
    bin_dir.mkdir()
    shim = bin_dir / "sbatch"
    shim.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec {shutil.which('sbatch')} \"$@\"\n")
    shim.chmod(0o755)
    return bin_dir, calls


def snakemake_env(src: Path, path: Path | None = None) -> dict:
    """The jobs inherit this environment (sbatch --export=ALL): `python -m noisymlt` imports from src."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH", "")]))
    if path:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    for var in [v for v in env if v.startswith("SLURM_")]:
        del env[var]                      # a run inside an allocation must not leak its job id
    return env


def run(cmd: list[str], cwd: Path, src: Path, timeout: int, path: Path | None = None) -> str:
    """Run cmd; its output, or an AssertionError with its tail when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=snakemake_env(src, path), capture_output=True, text=True,
                          timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log
