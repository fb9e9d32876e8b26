"""What the tests share, so that no test module imports another: where the tools are, the one copy of the project
and the environment its tools run in (this interpreter's tools first on PATH, the copy's code, DVC's own state inside
the copy), a command or a manual page's line run there, the manual's blocks, the own-data page's example folder,
the small configurations (a workflow layer, in-process trainer params) and the digests of a run's outputs.
Fixtures live in conftest.py; files fabricated as steps would leave them in fakes.py; [CL]'s network in
cl_network.py."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = BIN / "snakemake"
DVC = BIN / "dvc"


@functools.lru_cache(maxsize=1)
def _project_files() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return tuple(sorted(set(filter(None, listed.stdout.split("\0")))))


def project_copy(root: Path, params: dict | None = None) -> Path:
    """The project's own files (tracked, and new ones git does not ignore: a contributor's working tree as it is),
    without outputs, caches or the venv, in ``root``; with ``params``, those as its params.yaml. The one copy the
    tests make: the package's source is in it, and run_tool/snakemake run the copy's code (tool_env)."""
    import yaml

    for name in _project_files():
        source, target = REPO / name, root / name
        if source.is_symlink() or source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    if params is not None:
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def load_script(name: str):
    """scripts/NAME.py imported as module NAME (registered, so that a dataclass or a sibling script in it resolves),
    with scripts/ on the path, as `python scripts/NAME.py` has it."""
    import importlib.util

    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def output_digests(root: Path) -> dict[str, str]:
    """sha256 of every result file under data/, runs/ and reports/: not the logs, locks, timings, second links and
    memos a step keeps beside them (what .dvcignore leaves out too)."""
    import hashlib

    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in ("data", "runs", "reports") for p in sorted((root / top).rglob("*"))
            if p.is_file() and p.name not in ("train_log.jsonl", ".train.lock")
            and not p.name.endswith(".timing.json") and ".finished" not in p.parts
            and p.parent.name != "trunk"}


def snakemake(root: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in ``root`` with tool_env; its completed process, once it exited 0 (else the tail of its
    output in the assertion)."""
    proc = subprocess.run([str(SNAKEMAKE), *args], cwd=root, env={**tool_env(root), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


# ---------------------------------------------------------------- projects built once per run, copied per test
def shared_build(tmp_path_factory, name: str, build) -> Path:
    """The folder ``build(folder)`` fills, made once for the whole run: pytest-xdist's workers share it (the first
    builds it under a file lock, the others wait and read it). Tests take a copy (copy_build), never the folder."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / f"shared-{name}"
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".built").exists():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            build(folder)
            (folder / ".built").touch()
    return folder


def copy_build(folder: Path, dest: Path) -> Path:
    """A test's own copy of a shared build: file times kept (Snakemake's order of inputs and outputs), links as
    links, and its .snakemake records (the params and code each output was made with) along."""
    import shutil

    shutil.copytree(folder, dest, symlinks=True, ignore=shutil.ignore_patterns(".built", "locks", "incomplete"))
    return dest


# ---------------------------------------------------------------- the manual's pages, followed to the letter
def page(path: Path, title: str) -> str:
    """A manual page, which must be the one titled TITLE."""
    text = path.read_text()
    assert text.startswith(f"# {title}\n"), f"{path} is not the page '{title}'"
    return text


def blocks(text: str, language: str) -> list[str]:
    """The page's fenced code blocks in ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def commands(text: str) -> list[str]:
    """The non-empty lines of the page's bash blocks."""
    return [line for b in blocks(text, "bash") for line in b.splitlines() if line.strip()]


def run_line(line: str, root: Path, timeout: float = 900) -> str:
    """One of a page's command lines, run by bash in ``root`` with tool_env; its output, once it exited 0."""
    done = subprocess.run(line, shell=True, cwd=root, env=tool_env(root), capture_output=True, text=True,
                          timeout=timeout, executable="/bin/bash")
    assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    return done.stdout + done.stderr


OWN_DATA_PAGE = REPO / "docs" / "own-data.md"
OWN_DATA_CLASSES = ["cat", "dog", "bird", "fish"]
_COLOURS = ((220, 40, 40), (40, 200, 40), (40, 40, 220), (200, 200, 40))


def write_folder(root: Path, images: int = 400, seed: int = 0) -> None:
    """docs/own-data.md's example set: 32 px grey images with a coloured square a label, labels.csv in the wide
    form."""
    import csv

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = np.array(_COLOURS, np.uint8)
    (root / "images").mkdir(parents=True)
    with open(root / "labels.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["image", *OWN_DATA_CLASSES])
        for i in range(images):
            y = (rng.random(len(OWN_DATA_CLASSES)) < [0.6, 0.35, 0.2, 0.1]).astype(int)
            if not y.any():
                y[rng.integers(len(OWN_DATA_CLASSES))] = 1
            pixels = np.full((32, 32, 3), 128, np.uint8)
            for c in np.flatnonzero(y):
                x0, y0 = rng.integers(0, 20, 2)
                pixels[y0:y0 + 12, x0:x0 + 12] = colours[c]
            Image.fromarray(pixels).save(root / "images" / f"{i:03d}.png")
            rows.writerow([f"{i:03d}.png", *y])


def folder_project(root: Path, text: str | None = None) -> Path:
    """The project copy in ``root`` set up as docs/own-data.md says: the page's first YAML block written as the layer
    file it names, and its example images where the layer's folder block points."""
    import yaml

    text = text if text is not None else page(OWN_DATA_PAGE, "Add your own data")
    layer = blocks(text, "yaml")[0]
    name = layer.splitlines()[0].removeprefix("# ").strip()
    (root / name).write_text(layer)
    block = yaml.safe_load(layer)["datasets"]["mydata"]["folder"]
    write_folder(root / block["root"])
    return root


# Lines that stand in for torch in a probe process whose code reads only torch.cuda's two answers (the card choice,
# noisymlt.training.cards): CUDA available over the cards in CUDA_VISIBLE_DEVICES. A real `import torch` costs seconds
# a process, and the packing tests start up to eight at once on the test machine's cores.
CUDA_STAND_IN = ("import os, sys, types\n"
                 "sys.modules['torch'] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True, "
                 "device_count=lambda: len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))))\n")


# ---------------------------------------------------------------- small configurations
# The demo profile's layer, then a layer of the test's: what `snakemake --profile workflow/profiles/demo` reads.
# Snakemake's own scheduler pacing (1 s) instead of the profile's 5 s, which paces the demo's hundreds of waiting jobs
# but would leave each of a test's few-job runs waiting up to 5 s at its end for the scheduler's last timer.
DEMO_PROFILE = ("--profile", "workflow/profiles/demo", "--max-jobs-per-timespan", "100/1s")
DEMO_LAYER = "workflow/profiles/demo/params.yaml"

# A seconds-long grid over the demo profile: ERM and Ours at two noise rates, the K sweep (Ours variants) at 0.5:
# every kind of table and figure. Tests take it whole, or change what they need with tiny_layer(changes).
TINY = {
    "grid": {"datasets": ["toy"], "gammas": [0.5, 0.9], "seeds": [0], "methods": ["erm", "ours"], "ablations": ["ab_k"],
             "clean_methods": []},
    "ablations": {"ab_k": {"methods": ["ours_no_pseudo", "ours_k3"], "seeds": [0]}},  # the demo's: three
    "timing": {"methods": ["erm", "ours"], "trials": 1, "batch_sizes": [1, 64]},
    "datasets": {"toy": {"toy": {"seed": 0, "n_trainval": 600, "n_test": 200, "size": 32, "scenes": "glyph"},
                         "longtail": {"source": "pareto", "b": 6, "max": 150, "min": 4, "seed": 0, "groups": "fixed"}}},
    "train": {"epochs": 2, "batch_size": 16, "balanced_batch_size": 32, "image_size": 32, "warmup_iters": 2,
              "lr_steps": [2], "workers": 0},
    # a schedule's keys win over the train block: the demo's recipes set their own epochs
    "schedules": {name: {"train": {"warmup_iters": 2, "epochs": 2, "lr_steps": [2]}}
                  for name in ("db", "db_random")},
    # the demo's pretrained backbone through the real rule, in seconds: a small source task, one epoch
    "pretrain": {"toy_glyphs": {"epochs": 1, "source": {"classes": 8, "images_per_class": 16, "held_out_per_class": 4}}},
    # the demo's model selection (Ours: lr, then alpha x beta) in the run, as the layer select_ours.yaml runs it,
    # on two values each
    "selection": {"methods": {"ours": [["lr"], ["alpha", "beta"]]},
                  "grids": {"lr": [0.02, 0.08], "alpha": [0.9, 0.7], "beta": [0.1]}},
}


# conftest's tiny_runs_project: a run of each method family (single-branch ERM, BBN, ML-GCN, DivideMix, Ours) and of
# clean, then retrain (Clean-ERM and its oracle, on the cross-fitting's two folds) at one noise rate and two seeds,
# with the detection table of their suspect labels (noisymlt.inference) and of what each cleaning changed
TINY_RUNS = {"grid": {"gammas": [0.5], "seeds": [0, 1],
                      "methods": ["erm", "bbn", "mlgcn", "dividemix", "clean_erm", "oracle_erm", "ours"],
                      "ablations": []},
             "timing": {"methods": ["erm"], "batch_sizes": [1]}}


def tiny_layer(*changes: dict) -> dict:
    """TINY with each change merged over it as Snakemake layers config files (a dict merges key by key, anything
    else replaces): the one small configuration of the tests that run the workflow."""
    from noisymlt.config import deep_merge

    layer = TINY
    for change in changes:
        layer = deep_merge(layer, change)
    return layer


def write_layer(root: Path, layer: dict, name: str = "tiny.yaml") -> tuple[str, ...]:
    """``layer`` written to root/NAME; the arguments that run the demo profile with it."""
    import yaml

    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(yaml.safe_dump(layer, sort_keys=False))
    return (*DEMO_PROFILE, "--configfile", DEMO_LAYER, name)


# conftest's tiny_toy, built in the test process for the in-process runs: TINY's toy at the demo's cache size
TINY_TOY = {"n_trainval": 600, "n_test": 200, "size": 32}
TINY_CACHE_SIZE = 40  # the demo's train.cache_size
TINY_LONGTAIL = {"b": 6, "max_count": 150, "min_count": 4, "seed": 0}


def tiny_params(method: str = "erm", **train_overrides) -> dict:
    """params.yaml + the demo layer, shrunk to seconds-long CPU runs in this process on conftest's ``tiny_toy``:
    the configuration of the tests that build a Trainer themselves."""
    from noisymlt.config import deep_merge, load_params

    params = load_params(REPO / "params.yaml", REPO / DEMO_LAYER)
    # A scratch backbone (no pretrained file to make) that trains whole: these tests check mechanics;
    # the demo's pretrained resnet_tiny path has tests of its own (test_models, test_pretrain).
    small = {"epochs": 2, "batch_size": 16, "balanced_batch_size": 32, "image_size": 32, "workers": 0,
             "warmup_iters": 2, "lr_steps": [2], "eval_batch_size": 64, "epoch_length": "batches",
             "backbone": "smallcnn", "weights_path": None, "trainable": "all", "frozen_bn": False}
    overrides = {**small, **train_overrides}
    params["train"] = deep_merge(params["train"], overrides)
    for schedule in params["schedules"].values():  # a schedule's keys would win over the train block
        schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in overrides}
    params["grid"]["methods"] = [method]
    params["grid"].pop("clean_methods", None)  # the demo's clean column names methods this grid no longer has
    return params


def interrupt_training(monkeypatch, trainer, at_call: int) -> None:
    """Run ``trainer`` and stop it as Ctrl-C would (KeyboardInterrupt) in its ``at_call``-th training step."""
    original, calls = trainer.method.training_loss, {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer.method, "training_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()


def toy_trainer(tiny_toy: dict, resolved: dict, out_dir, **kwargs):
    """A Trainer over the ``tiny_toy`` files, on the CPU unless ``device`` says otherwise (kwargs:
    train_labels override, limit_iters, keep_stale...)."""
    from noisymlt.training.trainer import Trainer

    kwargs.setdefault("train_labels", tiny_toy["noisy"])
    kwargs.setdefault("device", "cpu")
    if resolved["train"].get("loader") == "cache":
        kwargs.setdefault("train_cache", tiny_toy["train_cache"])
        kwargs.setdefault("test_cache", tiny_toy["test_cache"])
    return Trainer(resolved, test_labels=tiny_toy["test"], split=tiny_toy["split"], train_images=tiny_toy["root"],
                   test_images=tiny_toy["root"], out_dir=out_dir, progress=False, **kwargs)
