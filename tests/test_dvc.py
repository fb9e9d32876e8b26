"""DVC's view of the pipeline (dvc.yaml): it plans the jobs Snakemake plans, tracks the code each step
runs, and really runs with a local-folder remote: repro, push, wipe, pull (byte-identical), no-op repro.

The DVC commands run in a copy of the project under tmp_path with its own DVC state, config and cache
folders, so nothing here touches the checkout's .dvc or the user's DVC settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DVC = BIN / "dvc"
SNAKEMAKE = BIN / "snakemake"
def _dvc_yaml() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _stage_body(stage: dict) -> dict:
    return stage.get("do", stage)


STEP_COMMANDS = {"raw": "make-toy", "train-images": "fetch-coco-images"}  # `noisymlt step X` runs these


def _commands(cmd: str) -> list[str]:
    """The noisymlt commands a stage's command line runs: `step X` runs steps.py and X's command."""
    words = cmd.split()
    first = words[words.index("noisymlt") + 1]
    if first != "step":
        return [first]
    step = words[words.index("step") + 1]
    return ["step", STEP_COMMANDS.get(step, step)]


def test_every_stage_depends_on_the_code_digests_of_what_it_runs_and_on_no_source_file():
    """No hand-kept list of modules: each stage's code dependency is the digest file of the commands it
    runs (data/code/COMMAND.json, training: data/code/train/METHOD.json), written by `code_digests` from
    the static import closures (noisymlt.codedeps), the same digests Snakemake passes its jobs."""
    from noisymlt import codedeps

    commands = codedeps.command_modules()
    for name, stage in _dvc_yaml().items():
        body = _stage_body(stage)
        deps = body.get("deps", [])
        if name == "code_digests":
            assert deps == ["src/noisymlt"] and "code-deps" in body["cmd"]
            continue
        assert not [d for d in deps if d.startswith("src/")], name
        code = sorted(d for d in deps if d.startswith("data/code/"))
        expected = {f"data/code/{c}.json" for c in _commands(body["cmd"])}
        if name == "train":
            expected = {"data/code/step.json", "data/code/train/${item.method}.json"}
        if name == "raw":  # toy data are generated, voc/coco downloaded: one stage runs either
            expected |= {"data/code/download.json"}
        assert set(code) == expected, name
        assert all(c.split("/")[-1].removesuffix(".json") in commands or "/train/" in c for c in code), name


def test_code_digest_files_change_only_for_the_steps_an_edit_touches(tmp_path):
    from noisymlt import codedeps
    from noisymlt.config import load_params

    params = load_params(REPO / "params.yaml")
    before = codedeps.digests(params)
    assert before["train/erm"] == before["train/rs"]  # same family, same loss: same code
    assert before["train/erm"] != before["train/db"] == before["train/db_focal"]
    paths = codedeps.write_digests(params, tmp_path / "code")
    stamps = {p: p.stat().st_mtime_ns for p in paths}
    codedeps.write_digests(params, tmp_path / "code")  # unchanged digests: files untouched
    assert {p: p.stat().st_mtime_ns for p in paths} == stamps
    assert json.loads((tmp_path / "code" / "train" / "bbn.json").read_text())["code_digest"] == before["train/bbn"]


# ------------------------------------------------------------------------------------ with the CLIs

def _env(root: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # `python` in dvc.yaml = this interpreter
        PYTHONPATH=str(root / "src"),  # the copied code, which is what the stages hash
        DVC_NO_ANALYTICS="1",
        DVC_SITE_CACHE_DIR=str(root / ".dvc-site-cache"),
        DVC_GLOBAL_CONFIG_DIR=str(root / ".dvc-global"),
        DVC_SYSTEM_CONFIG_DIR=str(root / ".dvc-system"),
    )
    env.pop("DVC_TEST", None)
    return env


def _run(args: list, root: Path, timeout: float = 300) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=root, env=_env(root), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def _project_copy(root: Path, params: dict, workflow: bool = False) -> Path:
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "src" / "noisymlt", root / "src" / "noisymlt", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if workflow:
        shutil.copy2(REPO / "Snakefile", root / "Snakefile")
        shutil.copytree(REPO / "workflow", root / "workflow", symlinks=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run([DVC, "init", "--no-scm", "--quiet"], root)
    return root


def _needs_tools() -> None:
    pytest.importorskip("noisymlt.steps", reason="dvc.yaml needs `noisymlt step` (noisymlt/steps.py)")
    if not DVC.exists():
        pytest.skip(f"dvc is not installed next to {sys.executable}")


@pytest.mark.slow
def test_dvc_plans_the_jobs_snakemake_plans(tmp_path):
    """Paper-scale params.yaml, main grid: every file a Snakemake job writes is a DVC output (or lies
    in one), and both plan the same training runs. (Ablation runs are Snakemake's only.)"""
    _needs_tools()
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["grid"]["ablations"] = []
    root = _project_copy(tmp_path / "proj", params, workflow=True)
    dump = ("import json; from dvc.repo import Repo\n"
            "print(json.dumps({s.addressing: [str(o.def_path) for o in s.outs] for s in Repo('.').index.stages}))")
    stages = json.loads(_run([sys.executable, "-c", dump], root).strip().splitlines()[-1])
    summary = _run([SNAKEMAKE, "--summary", "--cores", "1"], root).splitlines()
    header = next(i for i, line in enumerate(summary) if line.startswith("output_file\t"))
    smk = {line.split("\t")[0]: line.split("\t")[2] for line in summary[header + 1:] if "\t" in line}

    outs = {o for paths in stages.values() for o in paths}
    uncovered = sorted(f for f in smk if not any(f == o or f.startswith(o + "/") for o in outs))
    assert uncovered == [], f"Snakemake writes files no DVC stage declares: {uncovered[:10]}"
    dvc_runs = {Path(o).parent.as_posix() for s, paths in stages.items() if s.startswith("train@")
                for o in paths if o.endswith("predictions.npz")}
    smk_runs = {Path(f).parent.as_posix() for f, rule in smk.items() if rule == "train"}
    grid = params["grid"]
    assert len(dvc_runs) == len(grid["datasets"]) * len(grid["gammas"]) * len(grid["seeds"]) * len(grid["methods"])
    assert dvc_runs == smk_runs and "runs/coco/g0.9/s4/erm" in dvc_runs
    assert sum(s.startswith("raw@") for s in stages) == 2


def _tiny_params() -> dict:
    """A toy-only params.yaml (no voc/coco blocks, no download block) sized for a seconds-long run."""
    from noisymlt.config import deep_merge, load_params

    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    toy = params["datasets"]["toy"]
    toy["toy"] = {"seed": 0, "n_trainval": 240, "n_test": 60, "size": 32}
    toy["longtail"] = {"source": "pareto", "b": 6, "max": 60, "min": 3, "seed": 0}
    params["datasets"] = {"toy": toy}
    for key in ("download", "ablations"):
        params.pop(key, None)
    params["grid"] = {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"]}
    params["methods"] = {"erm": params["methods"]["erm"]}
    params["train"] = deep_merge(params["train"], {
        "epochs": 1, "batch_size": 16, "image_size": 32, "workers": 0, "warmup_iters": 2, "lr_steps": [1],
        "eval_batch_size": 64, "weights_path": None})  # dvc.yaml has no pretrain stage: resnet_tiny from scratch
    params.pop("pretrain", None)
    params["schedules"]["db"]["train"]["warmup_iters"] = 2  # a schedule's keys win over the train block
    return params


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in ("data", "runs", "reports") for p in sorted((root / top).rglob("*"))
            if p.is_file() and p.name not in ("train_log.jsonl", ".train.lock")}  # .dvcignored, not outputs


@pytest.mark.slow
def test_dvc_repro_push_wipe_pull_roundtrip(tmp_path):
    _needs_tools()
    from noisymlt.config import resolve_run, run_id

    params = _tiny_params()
    root = _project_copy(tmp_path / "proj", params)
    store = tmp_path / "store"
    _run([DVC, "remote", "add", "-d", "store", store], root)

    log = _run([DVC, "repro"], root)
    run = root / "runs" / "toy" / "g0.5" / "s0" / "erm"
    assert log.count("Running stage") == 14, log  # 12 + the image caches of the train subset and the test set
    assert "| ERM |" in (root / "reports" / "table_total.md").read_text()
    # the same run (same resolved config, hence id) the Snakemake rule would train
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run_id"] == run_id(resolve_run(params, "toy", "erm", 0.5, 0))
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0 < metrics["heads"]["main"]["map"]["total"] <= 100

    _run([DVC, "push"], root)
    before = _digests(root)
    assert len(before) > 500 and "runs/toy/g0.5/s0/erm/checkpoint.pt" in before  # raw images included
    assert any(store.rglob("*")), "the remote folder stayed empty"
    for top in ("data", "runs", "reports", ".dvc/cache"):
        shutil.rmtree(root / top)
    _run([DVC, "pull"], root)
    assert _digests(root) == before

    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}
    again = _run([DVC, "repro"], root)
    assert "Running stage" not in again and "up to date" in again

    # persist: a rerun of a train stage keeps its checkpoint and resumes from it (here: its last epoch)
    forced = _run([DVC, "repro", "--force", "--single-item", "train@toy-0.5-0-erm"], root)
    assert "resumed runs/toy/g0.5/s0/erm/checkpoint.pt from epoch 1" in forced, forced
