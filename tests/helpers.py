"""What the tests that run the pipeline's tools share: where the tools are, a copy of the project, the environment
they run in (this interpreter's tools first on PATH, DVC's own state inside the copy) and a command run there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = BIN / "snakemake"
DVC = BIN / "dvc"


def project_copy(root: Path) -> Path:
    """The committed project (its tracked files), without outputs or caches."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        source, target = REPO / name, root / name
        if source.is_symlink() or source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return root


def tool_env(root: Path) -> dict:
    """This interpreter's tools first on PATH (dvc.yaml's `snakemake`), the copy's code importable, and DVC's site,
    global and system config inside the copy: nothing touches the user's DVC settings."""
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(root / "src"),
        DVC_NO_ANALYTICS="1",
        DVC_SITE_CACHE_DIR=str(root / ".dvc-site-cache"),
        DVC_GLOBAL_CONFIG_DIR=str(root / ".dvc-global"),
        DVC_SYSTEM_CONFIG_DIR=str(root / ".dvc-system"),
    )
    env.pop("DVC_TEST", None)
    return env


def run_tool(args: list, root: Path, timeout: float = 600, expect: int = 0, env: dict | None = None) -> str:
    """A command (argument list) in ``root`` with tool_env; its stdout and stderr, once its exit status is
    ``expect``."""
    proc = subprocess.run([str(a) for a in args], cwd=root, env={**tool_env(root), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def tiny_params() -> dict:
    """A toy-only params.yaml (no voc/coco blocks, no download block) sized for a seconds-long run: the demo's
    settings, one noise rate and seed, ERM, one epoch, resnet_tiny from scratch (no pretrain job)."""
    from noisymlt.config import deep_merge, load_params

    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    toy = params["datasets"]["toy"]
    toy["toy"] = {"seed": 0, "n_trainval": 240, "n_test": 60, "size": 32}
    toy["longtail"] = {"source": "pareto", "b": 6, "max": 60, "min": 3, "seed": 0}
    params["datasets"] = {"toy": toy}
    for key in ("download", "ablations", "timing"):
        params.pop(key, None)
    params["grid"] = {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"]}
    params["methods"] = {"erm": params["methods"]["erm"]}
    params["train"] = deep_merge(params["train"], {
        "epochs": 1, "batch_size": 16, "image_size": 32, "workers": 0, "warmup_iters": 2, "lr_steps": [1],
        "eval_batch_size": 64, "weights_path": None})
    params.pop("pretrain", None)
    for name in ("db", "db_random"):  # a schedule's keys win over the train block
        params["schedules"][name]["train"].update(warmup_iters=2, epochs=1, lr_steps=[1])
    # model selection as the demo's (Ours: lr, then alpha x beta) on two values each; entries of absent methods go
    selection = params["selection"]
    selection["grids"] = {"lr": [0.02, 0.08], "alpha": [0.9, 0.7], "beta": [0.1]}
    selection["methods"] = {k: v for k, v in selection["methods"].items() if k in params["methods"] or "*" in k}
    return params


def workflow_copy(root: Path, params: dict) -> Path:
    """What a Snakemake run of the project reads (the Snakefile, its profiles, workflow/ and the package's source),
    with ``params`` as its params.yaml."""
    import yaml

    root.mkdir(parents=True)
    shutil.copy2(REPO / "Snakefile", root / "Snakefile")
    for folder in ("profiles", "workflow"):
        shutil.copytree(REPO / folder, root / folder, symlinks=True)
    shutil.copytree(REPO / "src" / "noisymlt", root / "src" / "noisymlt", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def output_digests(root: Path) -> dict[str, str]:
    """sha256 of every result file under data/, runs/ and reports/: not the logs, locks, timings, second links and
    memos a step keeps beside them (what .dvcignore leaves out too)."""
    import hashlib

    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in ("data", "runs", "reports") for p in sorted((root / top).rglob("*"))
            if p.is_file() and p.name not in ("train_log.jsonl", ".train.lock")
            and not p.name.endswith(".timing.json") and ".finished" not in p.parts
            and p.parent.name != "trunk"}
