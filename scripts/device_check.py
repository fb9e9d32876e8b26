#!/usr/bin/env python
"""One prepared check of the CUDA path, to run in the first minutes a GPU is available.

    scripts/device_check.sh                       # GPU machine: everything below, within 8 minutes
    scripts/device_check.sh --device cpu --quick  # CI: every part on small shapes, GPU parts skipped

Writes OUT/device_check.json (the same keys in every mode; GPU fields null without a GPU),
OUT/device_check.md (a short summary) and each part's log and raw measurements under OUT
($OUT, default benchmarks/device/). Stops starting new work at the time budget (--budget-min, default 8).

Parts (run in the order of PART_KEYS; what each imports besides torch and torchvision is NEEDS below; a part whose library
is missing, or that the time budget no longer allows, is skipped with a line saying so):
  environment  GPU name and memory, torch / CUDA / cuDNN versions, bf16 and TF32 support, which
               optional libraries are installed.
  step_profile scripts/step_profile.py: ERM, Ours and DB-Focal steps at paper shapes, eager and compiled
               (train.compile), with the torch profiler's view (device busy share, launches, top operators).
  smoke        the smoke profile (workflow/profiles/smoke: the paper's configuration, every method and
               ablation code path, one iteration an epoch) through Snakemake with --resources gpu=1, in a copy
               of the workflow under OUT/smoke (needs snakemake; skipped with --quick, since the test suite
               runs it: tests/test_profile_smoke.py).
  cuda_tests   the test suite's `gpu`-marked tests (they skip without CUDA; the `--resources gpu=2`
               test also needs Snakemake, which the GPU machine lacks: it then skips and says so).
  throughput   scripts/benchmark_throughput.py: ResNet-50 @ 224, batch 32 and balanced 256, bf16, for
               ERM, DB-Focal, BBN, DivideMix and Ours (quick: the demo's shapes), with each method's cost
               per image against a bare backbone and the GPU memory of one run.
  loader       scripts/benchmark_loader.py: the decoded cache + augmentation in img/s with this machine's
               cores, and whether that keeps up with each method's training img/s.
  end_to_end   the demo profile's `ours` at gamma 0.5, seed 0: its data, image caches and pretrained weights
               through Snakemake (the demo profile, in a copy of the workflow; needs snakemake), then train +
               evaluate + trace (`noisymlt step ...`, in this process) on the CPU and on CUDA; wall times and
               the mAP difference (quick: a smaller toy set).
  grid_wall    scripts/device_grid.py: every grid method at paper shapes on the enlarged smoke stand-in through
               Snakemake, packed as workflow/profiles/h200 packs them; from those runs, the paper grid's wall time on
               one card (without CUDA or with --dry-run: `snakemake -n` and the grid's plan only).
  grid         the paper grid's runs and iterations (scripts/gridcost.py: every run the workflow plans,
               iterations from the trainer's own planning code); with CUDA, GPU-hours at the measured
               step costs, unpacked and packed, packing measured with 2 and 4 concurrent runs as memory
               and time allow.

Libraries missing on the GPU machine (yaml, jsonschema, tqdm) can travel as wheels: put them in
benchmarks/wheels/ (or --wheels DIR); each is unpacked into OUT/site when its module is not importable.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import device_grid  # noqa: E402  (the grid_wall part, beside this script)

PAPER_METHODS = ["erm", "db_focal", "bbn", "dividemix", "ours"]
OPTIONAL_MODULES = ["yaml", "jsonschema", "tqdm", "scipy", "sklearn", "pandas", "pyarrow", "PIL", "matplotlib",
                    "pytest", "snakemake", "dvc"]
# the wheel file name's distribution -> the module it provides, where they differ
WHEEL_MODULES = {"pyyaml": "yaml", "rpds_py": "rpds", "jsonschema_specifications": "jsonschema_specifications",
                 "gitpython": "git"}
# Besides torch and torchvision: what each part imports (the trainer and the method registry read params with
# yaml and check method options with jsonschema; image caches and training report progress with tqdm).
NEEDS = {"smoke": ["snakemake", "yaml", "jsonschema", "tqdm", "scipy", "sklearn", "pandas", "pyarrow", "PIL",
                   "matplotlib"],
         "cuda_tests": ["pytest", "yaml", "jsonschema", "tqdm", "scipy", "pandas", "pyarrow", "PIL"],
         "throughput": ["yaml", "jsonschema"], "loader": ["PIL", "pandas", "pyarrow", "tqdm"],
         "end_to_end": ["snakemake", "yaml", "jsonschema", "tqdm", "scipy", "sklearn", "pandas", "pyarrow", "PIL"],
         "grid": ["yaml", "jsonschema", "pandas", "pyarrow"],
         "step_profile": ["yaml", "jsonschema"],
         "grid_wall": ["snakemake", "yaml", "jsonschema", "tqdm", "scipy", "sklearn", "pandas", "pyarrow", "PIL",
                       "matplotlib"]}
# Shrinks the demo for `--quick` (CPU CI): a smaller toy set and source task, two epochs.
QUICK_LAYER = {
    "datasets": {"toy": {"toy": {"seed": 0, "n_trainval": 600, "n_test": 200, "size": 64},
                         "longtail": {"source": "pareto", "b": 6, "max": 120, "min": 4, "seed": 0,
                                      "cap_to_available": True}}},
    "pretrain": {"toy_glyphs": {"source": {"seed": 0, "classes": 48, "images_per_class": 8, "held_out_per_class": 4,
                                           "size": 64}, "epochs": 1}},
    "train": {"epochs": 2, "lr_steps": [1], "warmup_iters": 4},
    "schedules": {"db": {"train": {"warmup_iters": 4}}},
}
# In every mode one final run with the demo's fixed values: its model selection (16 candidates) is not what
# this part times, and a final run under selection needs the selection's choice file.
FIXED_LAYER = {"selection": {"enabled": False}}
E2E = {"dataset": "toy", "method": "ours", "gamma": 0.5, "seed": 0}
# What end_to_end keeps in OUT/e2e of the Snakemake run that prepared its data: each job's log and time.
PREPARE_RECORDS = ["logs/**/*.log", "benchmarks/**/*.tsv"]

log = logging.getLogger("device_check")


class Budget:
    """Wall-clock budget: parts ask how long they may still run and are skipped when it is spent."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


class Skip(Exception):
    """A part that cannot run here; the message says why."""


# Every key of every part, present in every mode (null where a part or a field did not run).
PART_KEYS = {
    "step_profile": ["device", "precision", "backbone", "image_size", "methods"],
    "cuda_tests": ["files", "passed", "failed", "skipped", "tests"],
    "throughput": ["device", "precision", "backbone", "image_size", "batch_size", "balanced_batch_size", "methods",
                   "bare"],
    "loader": ["rows", "best", "keeps_up", "device_images", "device_over_ours"],
    "end_to_end": ["params", "quick_layer", "fixed_layer", "dataset", "method", "gamma", "seed", "prepare_s", "cpu",
                   "cpu_reason", "cuda", "cuda_reason", "map_difference_cuda_minus_cpu"],
    "grid_wall": device_grid.KEYS,
    "smoke": ["device", "runs", "methods", "map_min", "map_max", "log"],
    "grid": ["runs", "candidates", "crossfit_runs", "iterations", "by_dataset", "by_method", "labels", "packing", "device", "gpu_hours",
             "gpu_hours_reason"],
}


def part_record(name: str) -> dict:
    return {"status": None, "reason": None, "wall_s": None, **dict.fromkeys(PART_KEYS[name])}


# --------------------------------------------------------------------------------------------- helpers

def module_version(name: str) -> str | None:
    """The installed version of the distribution providing module ``name`` (read from its metadata, without
    importing it); None when the module is not importable."""
    if importlib.util.find_spec(name) is None:
        return None
    dists = importlib.metadata.packages_distributions().get(name) or [name]
    try:
        return importlib.metadata.version(dists[0])
    except importlib.metadata.PackageNotFoundError:  # e.g. unpacked from a wheel without its metadata
        return "?"


def wheel_modules(wheel: Path) -> set[str]:
    """The top-level modules a wheel installs (from its file list: folders and .py files outside its
    .dist-info and .data)."""
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/", 1)[0] for name in z.namelist()}
    return {t[:-3] if t.endswith(".py") else t.split(".")[0] for t in tops
            if not t.endswith((".dist-info", ".data")) and (t.endswith(".py") or "." not in t)}


def unpack_wheels(wheels: Path, site: Path) -> list[str]:
    """Unpack each wheel in ``wheels`` none of whose modules is importable into ``site`` (a wheel is a zip of its
    installed files), so that a library the machine has is never shadowed; returns the modules added."""
    added = []
    for wheel in sorted(wheels.glob("*.whl")):
        dist = wheel.name.split("-")[0].lower()
        modules = wheel_modules(wheel) or {WHEEL_MODULES.get(dist, dist)}
        if any(importlib.util.find_spec(m) is not None for m in modules):
            continue
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        added.extend(sorted(modules))
    if added:
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    return added


def missing(part: str) -> list[str]:
    return [m for m in NEEDS.get(part, []) if importlib.util.find_spec(m) is None]


def run_logged(cmd: list[str], log_path: Path, timeout: float, env: dict | None = None,
               cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run a command with its output in ``log_path``; a timeout or non-zero exit raises with the log's tail."""
    with open(log_path, "w") as out:
        out.write("+ " + " ".join(cmd) + "\n")
        out.flush()
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=max(timeout, 1), env=env,
                                  cwd=cwd)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {timeout:.0f} s (time budget); log: {log_path}") from None
    if proc.returncode != 0:
        tail = log_path.read_text().strip().splitlines()[-5:]
        raise RuntimeError(f"exit status {proc.returncode}; log: {log_path}: " + " | ".join(tail))
    return proc


def child_env(site: Path) -> dict:
    env = dict(os.environ)
    paths = [str(REPO / "src")] + ([str(site)] if site.is_dir() else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


# --------------------------------------------------------------------------------------------- parts

def environment() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    capability = f"{props.major}.{props.minor}" if props else None
    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)), "torch": torch.__version__,
        "torchvision": module_version("torchvision"), "cuda_available": cuda,
        "cuda_runtime": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu_name": props.name if props else None, "gpu_count": torch.cuda.device_count() if cuda else None,
        "gpu_memory_gib": round(props.total_memory / 2**30, 2) if props else None, "gpu_capability": capability,
        "bf16_supported": bool(torch.cuda.is_bf16_supported()) if cuda else None,
        "tf32_supported": bool(props.major >= 8) if props else None,
        "tf32_matmul_allowed": bool(torch.backends.cuda.matmul.allow_tf32) if cuda else None,
        "modules": {m: module_version(m) for m in OPTIONAL_MODULES},
    }


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def cuda_tests(ctx: dict) -> dict:
    files = gpu_test_files()
    xml = ctx["out"] / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
    try:
        run_logged(cmd, ctx["out"] / "logs" / "cuda_tests.log", min(ctx["budget"].left(), 240), ctx["env"])
    except RuntimeError as exc:
        if not xml.exists():
            raise
        failure = str(exc)
    else:
        failure = None
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, reason = "passed", None
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag in ("failure", "error") else "skipped"
                reason = (node.get("message") or "").strip()[:300]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "reason": reason})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    if failure and not counts["failed"]:
        raise RuntimeError(failure)
    return {"files": files, **counts, "tests": tests, "status": "failed" if counts["failed"] else "ok",
            "reason": f"{counts['failed']} test(s) failed" if counts["failed"] else None}


def step_profile(ctx: dict) -> dict:
    """scripts/step_profile.py: ERM, Ours and DB-Focal steps eager and compiled, with the profiler's view."""
    out = ctx["out"] / "step_profile.json"
    args = ["--device", ctx["device"], "--json", str(out)]
    if ctx["dry_run"]:  # the code path in seconds: one method, eager, the demo's shapes
        args += ["--quick", "--methods", "erm", "--modes", "eager"]
    elif ctx["quick"]:
        args += ["--quick", "--methods", "erm", "ours", "--modes", "eager"]
    else:  # ERM first (its step is the acceptance's), then Ours, whose rate the device loader must beat
        # new modes start while the loaders (~40 s) and grid_wall (<= 330 s) still fit in the budget
        args += ["--methods", "erm", "ours", "db_focal", "--budget-s", f"{max(ctx['budget'].left() - 420, 60):.0f}"]
    run_logged([sys.executable, "scripts/step_profile.py", *args], ctx["out"] / "logs" / "step_profile.log",
               min(ctx["budget"].left(), 420), ctx["env"])
    info = json.loads(out.read_text())
    return {k: info[k] for k in PART_KEYS["step_profile"]}


def throughput(ctx: dict) -> dict:
    if ctx["quick"]:
        args = ["--params", "params.yaml", "workflow/profiles/demo/params.yaml", "--dataset", "toy", "--iters", "1",
                "--warmup", "0", "--rounds", "1", "--num-images", "96"]
    else:  # paper shapes: params.yaml's VOC settings (ResNet-50 @ 224, batch 32, balanced 256, bf16)
        args = ["--params", "params.yaml", "--dataset", "voc", "--iters", "8", "--warmup", "2", "--rounds", "2"]
    out = ctx["out"] / "throughput.json"
    cmd = [sys.executable, "scripts/benchmark_throughput.py", *args, "--methods", *PAPER_METHODS,
           "--device", ctx["device"], "--json", str(out)]
    run_logged(cmd, ctx["out"] / "logs" / "throughput.log", min(ctx["budget"].left(), 240), ctx["env"])
    info = json.loads(out.read_text())
    rows = {r["method"]: r for r in info["rows"]}
    t = info["train"]
    return {"device": info["device"], "precision": info["precision"], "backbone": t["backbone"],
            "image_size": t["image_size"], "batch_size": t["batch_size"], "balanced_batch_size": t["balanced_batch_size"],
            "methods": {m: rows[m] for m in PAPER_METHODS if m in rows},
            "bare": {k: v for k, v in rows.items() if k not in PAPER_METHODS}}


def loader(ctx: dict) -> dict:
    workers = sorted({0, *(() if ctx["quick"] else (max(1, ctx["cores"] // 2), ctx["cores"]))})
    if ctx["quick"]:
        args = ["--scenario", "toy", "--images", "64"]
    else:
        args = ["--scenario", "voc", "--images", "256"]
    out = ctx["out"] / "loader.json"
    cmd = [sys.executable, "scripts/benchmark_loader.py", *args, "--workers", *map(str, workers), "--device",
           ctx["device"], "--json", str(out)]
    run_logged(cmd, ctx["out"] / "logs" / "loader.log", min(ctx["budget"].left(), 180), ctx["env"])
    rows = json.loads(out.read_text())["results"][0]["rows"]
    cache_rows = [r for r in rows if r["loader"].startswith(("cache", "device_images"))]
    best = max(cache_rows, key=lambda r: r["img_per_s"])
    trained = (ctx["results"]["throughput"].get("methods") or {})
    # the training set on the device at Ours' balanced batch, against what Ours' fastest step consumes
    device_rows = [r for r in rows if r["loader"].startswith("device_images")]
    device = max(device_rows, key=lambda r: r["img_per_s"]) if device_rows else None
    steps = (ctx["results"].get("step_profile") or {}).get("methods") or {}
    ours = [v["images_per_s"] for v in (steps.get("ours") or {}).values() if isinstance(v, dict) and v.get("images_per_s")]
    ours_rate = max(ours) if ours else (trained.get("ours") or {}).get("train_images_per_s")
    return {"rows": rows, "best": best,
            "keeps_up": {m: best["img_per_s"] >= r["train_images_per_s"] for m, r in trained.items()} or None,
            "device_images": device,
            "device_over_ours": device["img_per_s"] / ours_rate if device and ours_rate else None}


@contextlib.contextmanager
def captured(log_path: Path, cwd: Path):
    """In-process CLI steps: output to ``log_path``, working directory ``cwd``, logging re-attached."""
    old_cwd = os.getcwd()
    with open(log_path, "a") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        logging.root.handlers.clear()  # the step's basicConfig then writes to this log
        os.chdir(cwd)
        try:
            yield
        finally:
            os.chdir(old_cwd)
            logging.root.handlers.clear()


def noisymlt(argv: list[str], work: Path, log_path: Path) -> None:
    """One pipeline step in this process (torch is imported once for all of them)."""
    from noisymlt.cli import main

    with captured(log_path, work):
        print("+ noisymlt " + " ".join(argv), flush=True)
        status = main(argv)
    if status:
        tail = log_path.read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"noisymlt {argv[0]}: exit status {status}; "
                           f"log: {log_path}: " + " | ".join(tail))


def smoke(ctx: dict) -> dict:
    """The smoke profile through Snakemake on this machine's device, in a copy of the workflow files."""
    if ctx["quick"] and not ctx["dry_run"]:
        raise Skip("quick mode: the test suite runs the smoke profile (tests/test_profile_smoke.py)")
    # in a temporary folder: its records and logs are kept in OUT/smoke, its checkpoints and caches are not
    work = Path(tempfile.mkdtemp(prefix="device_check_smoke_"))
    try:
        return smoke_in(ctx, work)
    finally:
        device_grid.keep_records(work, ctx["out"] / "smoke")
        shutil.rmtree(work, ignore_errors=True)


def smoke_in(ctx: dict, work: Path) -> dict:
    device_grid.copy_workflow(work)
    log_path = ctx["out"] / "logs" / "smoke.log"
    cmd = [sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/smoke", "--resources", "gpu=1",
           "--cores", str(max(4, min(ctx["cores"], 8)))]
    if ctx["dry_run"]:  # the plan only: Snakemake's dry run of the same command
        run_logged([*cmd, "-n", "--quiet", "rules"], log_path, min(ctx["budget"].left(), 60), ctx["env"], cwd=work)
        return {"runs": device_grid.planned_train_jobs(log_path.read_text()),
                "log": str(log_path.relative_to(ctx["out"])), "reason": "dry run: planned only"}
    # a few minutes on a GPU; a CPU (a full check without --quick) takes the budget it is given
    run_logged(cmd, log_path, min(ctx["budget"].left(), 420 if ctx["device"] == "cuda" else math.inf),
               ctx["env"], cwd=work)
    sys.path.insert(0, str(REPO / "src"))
    from noisymlt.pipeline import paths
    from noisymlt.config import load_params

    params = load_params(work / "params.yaml", work / "workflow/profiles/smoke/params.yaml")
    maps, devices = {}, set()
    for run_key in paths.all_runs(params):
        run = work / paths.run_dir(*run_key)
        method = run_key.method
        maps[method] = next(iter(json.loads((run / "map.json").read_text()).values()))["total"]  # reported head
        devices.add(json.loads((run / "manifest.json").read_text())["environment"]["device"])
    return {"device": sorted(devices), "runs": len(maps), "methods": sorted(maps), "map_min": min(maps.values()),
            "map_max": max(maps.values()), "log": str(log_path.relative_to(ctx["out"]))}


def warm_up() -> None:
    """This process's one-time costs, paid before the first run is timed (the data steps ran in Snakemake's jobs, not
    here), so that its train_s counts its training: every step's import, torchvision's (~3 s on 2 cores: a backbone
    imports it when first built) and torch's first CPU convolution."""
    import torch
    import torchvision  # noqa: F401
    from noisymlt.cli import build_parser

    build_parser()
    torch.nn.Conv2d(3, 8, 3)(torch.randn(2, 3, 32, 32)).sum().backward()


def end_to_end(ctx: dict) -> dict:
    import yaml

    # in a copy of the workflow, as the smoke part: Snakemake prepares the run's data there, by the rules' own commands
    work = device_grid.copy_workflow(Path(tempfile.mkdtemp(prefix="device_check_e2e_")))
    keep = ctx["out"] / "e2e"
    keep.mkdir(exist_ok=True)
    log_path = ctx["out"] / "logs" / "end_to_end.log"
    params = ["params.yaml", "workflow/profiles/demo/params.yaml"]  # in work, the later layers over the earlier
    for name, layer in (("quick", QUICK_LAYER if ctx["quick"] else None), ("fixed", FIXED_LAYER)):
        if layer:
            (work / f"{name}.yaml").write_text(yaml.safe_dump(layer))
            params.append(f"{name}.yaml")
    d, g, s, method = E2E["dataset"], E2E["gamma"], E2E["seed"], E2E["method"]
    from noisymlt.config import config_text, final_run, load_params
    from noisymlt.data import assets
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline import paths
    from noisymlt.pipeline.paths import run_dir

    noisy, test, split = (L.fill(L.NOISY, dataset=d, gamma=g, seed=s), L.fill(L.TEST_LABELS, dataset=d),
                          L.fill(L.CLASS_SPLIT, dataset=d))
    result = {"params": [{"quick.yaml": "quick layer", "fixed.yaml": "fixed layer"}.get(p, p) for p in params],
              "quick_layer": QUICK_LAYER if ctx["quick"] else None, "fixed_layer": FIXED_LAYER, **E2E}
    try:
        P = load_params(*(work / p for p in params))
        resolved = final_run(P, d, method, g, s, None)  # the train rule's config param
        loader = resolved["train"].get("loader", "pil")
        # what the train rule reads (workflow/rules/train.smk): labels, split, backbone weights, image caches
        targets = [noisy, test, split, *assets.run_files(resolved), *paths.cache_args(d, loader)[1::2]]
        # the demo profile with these layers over params.yaml (its own --configfile, replaced); targets after `--`,
        # which --configfile would otherwise take as layers
        cmd = [sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/demo", "--configfile", *params[1:],
               "--cores", str(ctx["cores"]), "--printshellcmds", "--", *targets]
        t0 = time.perf_counter()
        run_logged(cmd, log_path, ctx["budget"].left(), ctx["env"], cwd=work)
        result["prepare_s"] = time.perf_counter() - t0  # Snakemake's whole run: parsing, planning and every job
        warm_up()
        for device in ("cpu", "cuda"):
            if device == "cuda" and ctx["device"] != "cuda":
                result["cuda"] = None
                result["cuda_reason"] = "no CUDA device"
                continue
            if not ctx["budget"].allows(30):
                result[device] = None
                result[f"{device}_reason"] = f"time budget: {ctx['budget'].left():.0f} s left"
                continue
            run = run_dir(d, g, s, method, root=f"runs/{device}")
            t0 = time.perf_counter()
            (work / run).mkdir(parents=True, exist_ok=True)
            (work / run / "requested_config.json").write_text(config_text(resolved) + "\n")
            noisymlt(["train", "--run-config", f"{run}/requested_config.json", "--train-labels", noisy,
                      "--test-labels", test, "--split", split, "--train-images", paths.image_root(P, d, "train"),
                      "--test-images", paths.image_root(P, d, "test"), *paths.cache_args(d, loader), "--out", run,
                      "--no-progress", "--device", device], work, log_path)
            train_s = time.perf_counter() - t0
            noisymlt(["evaluate", "--predictions", f"{run}/predictions.npz", "--test-labels", test, "--split", split,
                      "--out", f"{run}/metrics.json"], work, log_path)
            reports = f"reports/{device}"
            noisymlt(["aggregate", f"{run}/metrics.json", "--out", f"{reports}/results.parquet"], work, log_path)
            noisymlt(["table", "--results", f"{reports}/results.parquet", "--out", f"{reports}/table.tex",
                      "--methods", method, "--params", *params], work, log_path)
            try:
                noisymlt(["trace", f"{method}/ensemble/{d}/{g}", "--sidecar", f"{reports}/table.cells.json"],
                         work, log_path)
                trace_ok = True
            except RuntimeError:
                trace_ok = False
            metrics = json.loads((work / run / "metrics.json").read_text())
            manifest = json.loads((work / run / "manifest.json").read_text())
            result[device] = {"train_s": train_s, "device": manifest["environment"]["device"], "trace_ok": trace_ok,
                              "map": {head: m["map"]["total"] for head, m in metrics["heads"].items()}}
            result[f"{device}_reason"] = None
            for name in ("metrics.json", "manifest.json", "train_log.jsonl"):
                if (work / run / name).exists():
                    (keep / device).mkdir(exist_ok=True)
                    shutil.copy2(work / run / name, keep / device / name)
    finally:
        device_grid.keep_records(work, keep, PREPARE_RECORDS)
        shutil.rmtree(work, ignore_errors=True)
        if ctx["device"] == "cuda":  # the packing measurement that follows wants the card to itself
            import torch

            torch.cuda.empty_cache()
    both = result.get("cpu") and result.get("cuda")
    result["map_difference_cuda_minus_cpu"] = (
        {h: result["cuda"]["map"][h] - result["cpu"]["map"][h] for h in result["cpu"]["map"]} if both else None)
    bad = [dev for dev in ("cpu", "cuda") if result.get(dev) and not result[dev]["trace_ok"]]
    if bad:
        result.update(status="failed", reason=f"trace failed for the {', '.join(bad)} run (see the log)")
    return result


def packing(ctx: dict, per_run_mib: float | None) -> dict:
    """Aggregate Ours img/s of 1, 2, 4 concurrent benchmark processes on one GPU (as memory and time allow)."""
    import torch

    record = {"per_run_mib": per_run_mib, "runs_fit_in_memory": None, "concurrent": [], "speedup": None,
              "reason": None}
    if ctx["device"] != "cuda":
        record["reason"] = "no CUDA device"
        return record
    total_mib = torch.cuda.get_device_properties(0).total_memory / 2**20
    if per_run_mib:
        # ~1 GiB per process for the CUDA context and allocator slack, 10% of the card left free
        record["runs_fit_in_memory"] = int(0.9 * total_mib // (per_run_mib + 1024))
    single = None
    for runs in (1, 2, 4):
        if record["runs_fit_in_memory"] is not None and runs > record["runs_fit_in_memory"]:
            record["reason"] = f"{runs} runs do not fit in {total_mib / 1024:.0f} GiB"
            break
        if not ctx["budget"].allows(60):
            record["reason"] = f"time budget: {ctx['budget'].left():.0f} s left before {runs} concurrent runs"
            break
        barrier = ctx["out"] / f"packing_{runs}.barrier"
        barrier.mkdir(exist_ok=True)
        procs, outs = [], []
        for i in range(runs):
            out = ctx["out"] / f"packing_{runs}_{i}.json"
            outs.append(out)
            cmd = [sys.executable, "scripts/benchmark_throughput.py", "--params", "params.yaml", "--dataset", "voc",
                   "--methods", "ours", "--device", "cuda", "--iters", "8", "--warmup", "2", "--rounds", "1",
                   "--barrier", str(barrier), "--json", str(out)]
            log_file = open(ctx["out"] / "logs" / f"packing_{runs}_{i}.log", "w")
            procs.append((subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=ctx["env"], cwd=REPO),
                          log_file))
        # every process has built its nets: start their timing together
        while len(list(barrier.glob("*.ready"))) < runs and all(p.poll() is None for p, _ in procs) \
                and ctx["budget"].left() > 0:
            time.sleep(0.1)
        (barrier / "go").touch()
        for proc, log_file in procs:
            try:
                proc.wait(timeout=max(ctx["budget"].left(), 1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log_file.close()
        shutil.rmtree(barrier, ignore_errors=True)
        if any(p.returncode != 0 for p, _ in procs):
            record["reason"] = f"{runs} concurrent runs failed (logs/packing_{runs}_*.log)"
            break
        rates = [next(r for r in json.loads(o.read_text())["rows"] if r["method"] == "ours")["train_images_per_s"]
                 for o in outs]
        single = single or rates[0]
        record["concurrent"].append({"runs": runs, "images_per_s_each": rates, "images_per_s_total": sum(rates),
                                     "speedup": sum(rates) / single})
    if len(record["concurrent"]) > 1:
        record["speedup"] = max(c["speedup"] for c in record["concurrent"])
    return record


def grid(ctx: dict) -> dict:
    import gridcost
    from noisymlt.config import load_params

    params = load_params(REPO / "params.yaml")
    jobs = gridcost.plan_grid(params, data_root=REPO / "data")
    (ctx["out"] / "grid_plan.json").write_text(json.dumps(jobs, indent=0) + "\n")
    summary = gridcost.summarise(jobs)
    sources = sorted({j["labels"] for j in jobs})
    measured = ctx["results"]["throughput"].get("methods") or {}
    on_gpu = ctx["device"] == "cuda" and ctx["results"]["throughput"]["status"] == "ok"
    record = {**summary, "labels": sources if len(sources) < 5 else f"{len(sources)} noisy label files",
              "packing": None, "gpu_hours": None, "device": None,
              "gpu_hours_reason": None if on_gpu else "no CUDA throughput measured at paper shapes"}
    ours = measured.get("ours") or {}
    record["packing"] = packing(ctx, ours.get("peak_gpu_mem_mib"))
    if on_gpu:
        record["device"] = ctx["results"]["throughput"]["device"]
        record["gpu_hours"] = gridcost.gpu_hours(jobs, measured, record["packing"]["speedup"])
    return record


# --------------------------------------------------------------------------------------------- report

def summary_markdown(result: dict) -> str:
    env, parts = result["environment"], result["parts"]
    lines = [f"# Device check ({result['mode']['device']}{', quick' if result['mode']['quick'] else ''})", "",
             f"{env.get('gpu_name') or 'no GPU'}; torch {env.get('torch')}, CUDA {env.get('cuda_runtime')}, "
             f"bf16 {env.get('bf16_supported')}, TF32 {env.get('tf32_supported')}; {env.get('cpu_count')} CPU cores; "
             f"{result['wall_s']:.0f} s of a {result['mode']['budget_s']:.0f} s budget.", "",
             "| part | status | s | note |", "|---|---|---|---|"]
    for name, p in parts.items():
        wall = "" if p["wall_s"] is None else f"{p['wall_s']:.0f}"
        lines.append(f"| {name} | {p['status']} | {wall} | {p['reason'] or ''} |")
    sm = parts.get("smoke") or {}  # absent from checks made before the part existed
    if sm.get("status") == "ok" and sm.get("device") is None:  # --dry-run
        lines += ["", f"Smoke profile: planned only (--dry-run), {sm['runs']} train jobs."]
    elif sm.get("status") == "ok":
        lines += ["", f"Smoke profile on {', '.join(sm['device'])}: {sm['runs']} runs, every one trained and "
                  f"evaluated (test mAP {sm['map_min']:.1f}-{sm['map_max']:.1f} after 8 iterations)."]
    sp = parts.get("step_profile") or {}
    if sp.get("methods"):
        lines += ["", f"Training steps on {sp['device']} ({sp['backbone']} @ {sp['image_size']} px, {sp['precision']}), "
                  "eager and compiled (train.compile), with the profiler's view: the share of the step the device "
                  "is busy and its kernel launches:", "",
                  "| method | mode | ms/step | img/s | device busy | launches/step | top operator |",
                  "|---|---|---|---|---|---|---|"]
        for m, modes in sp["methods"].items():
            for mode, r in modes.items():
                if isinstance(r, dict) and "error" in r:
                    lines.append(f"| {m} | {mode} | failed | | | | {r['error'][:120]} |")
                if not isinstance(r, dict) or "ms_per_step" not in r:
                    continue
                busy = "" if r["device_busy_share"] is None else f"{100 * r['device_busy_share']:.0f}%"
                launches = "" if r["kernel_launches_per_step"] is None else f"{r['kernel_launches_per_step']:.0f}"
                top = r["top_ops"][0]["op"] if r["top_ops"] else ""
                lines.append(f"| {m} | {mode} | {r['ms_per_step']:.1f} | {r['images_per_s']:.0f} | {busy} | "
                             f"{launches} | {top} |")
    ct = parts["cuda_tests"]
    if ct["status"] == "ok" or ct["status"] == "failed":
        lines += ["", f"CUDA tests: {ct['passed']} passed, {ct['failed']} failed, {ct['skipped']} skipped."]
    tp = parts["throughput"]
    if tp.get("methods"):
        quick = " (quick mode: one step each without warm-up, a smoke test, not a measurement)"
        lines += ["", f"Throughput on {tp['device']} ({tp['backbone']} @ {tp['image_size']} px, {tp['precision']}, "
                  f"batch {tp['batch_size']} / balanced {tp['balanced_batch_size']})"
                  f"{quick if result['mode']['quick'] else ''}:", "",
                  "| method | img/step | ms/step | img/s | cost/img vs bare | peak MiB |", "|---|---|---|---|---|---|"]
        for m, r in tp["methods"].items():
            peak = "" if r["peak_gpu_mem_mib"] is None else f"{r['peak_gpu_mem_mib']:.0f}"
            lines.append(f"| {m} | {r['train_images_per_step']} | {r['ms_per_step']:.1f} | {r['train_images_per_s']:.1f}"
                         f" | {r['cost_per_image_vs_bare']:.2f}x | {peak} |")
    ld = parts["loader"]
    if ld.get("best"):
        slower = [m for m, ok in (ld["keeps_up"] or {}).items() if not ok]
        lines += ["", f"Loader: best {ld['best']['img_per_s']:.0f} img/s ({ld['best']['loader']}, "
                  f"{ld['best']['workers']} workers); "
                  + (f"slower than the training of {', '.join(slower)}." if slower
                     else "keeps up with every method." if ld["keeps_up"] else "no training rate measured to compare.")]
    if ld.get("device_images"):
        ratio = ld.get("device_over_ours")
        lines.append(f"Training set on the device (train.device_images): {ld['device_images']['img_per_s']:.0f} img/s "
                     f"({ld['device_images']['loader']})"
                     + (f", {ratio:.2f}x what Ours' fastest measured step consumes." if ratio else "."))
    e2e = parts["end_to_end"]
    for dev in ("cpu", "cuda"):
        if e2e.get(dev):
            r = e2e[dev]
            maps = ", ".join(f"{head} {100 * v:.2f}" for head, v in r["map"].items())
            lines.append(f"End to end on {dev}: train {r['train_s']:.0f} s; mAP (%) {maps}; trace ok: {r['trace_ok']}.")
    if e2e.get("map_difference_cuda_minus_cpu"):
        diffs = ", ".join(f"{head} {100 * v:+.2f}" for head, v in e2e["map_difference_cuda_minus_cpu"].items())
        lines.append(f"mAP CUDA - CPU (points): {diffs}.")
    lines += device_grid.summary_lines(parts.get("grid_wall") or {})
    gr = parts["grid"]
    if gr.get("runs"):
        per_dataset = ", ".join(f"{d}: {v['runs']} runs, {v['iterations']} it" for d, v in gr["by_dataset"].items())
        lines += ["", f"Paper grid: {gr['runs']} runs ({gr['candidates']} of them model-selection candidates), "
                  f"{gr['iterations']} training iterations ({per_dataset}); "
                  f"noisy labels planned from: {gr['labels']}."]
        if gr["gpu_hours"]:
            h = gr["gpu_hours"]
            packed = "" if h["packed_total"] is None else f", packed {h['packed_total']:.1f}"
            lines.append(f"GPU-hours of the training steps on {gr['device']}: {h['total']:.1f}{packed} "
                         "(" + ", ".join(f"{d} {v:.1f}" for d, v in h["by_dataset"].items()) + ").")
        else:
            lines.append(f"GPU-hours: not estimated ({gr['gpu_hours_reason']}).")
        pk = gr.get("packing") or {}
        if pk.get("concurrent"):
            lines.append("Packing: " + ", ".join(f"{c['runs']} runs {c['speedup']:.2f}x" for c in pk["concurrent"])
                         + f"; {pk['runs_fit_in_memory']} runs fit in memory.")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="auto: CUDA when available")
    ap.add_argument("--quick", action="store_true", help="small shapes and one short run (the CPU CI mode)")
    ap.add_argument("--dry-run", action="store_true",
                    help="plan and take every part's code path in seconds, on any machine: the workflows through "
                         "`snakemake -n`, the paper grid's plan, one eager step, the loaders on the demo's shapes; "
                         "the measuring parts are skipped and no time is measured for the grid")
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/device", help="output folder ($OUT)")
    ap.add_argument("--budget-min", type=float, default=8.0, help="stop starting work after this many minutes")
    ap.add_argument("--wheels", default="benchmarks/wheels", help="wheels of missing libraries (optional)")
    ap.add_argument("--parts", nargs="+", choices=list(PART_KEYS), default=list(PART_KEYS),
                    help="run only these parts (a rerun of what failed; the grid's GPU-hours need throughput)")
    args = ap.parse_args()
    started = time.monotonic()
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    site = out / "site"
    wheels = Path(args.wheels) if Path(args.wheels).is_absolute() else REPO / args.wheels
    added = unpack_wheels(wheels, site) if wheels.is_dir() else []
    sys.path.insert(0, str(REPO / "src"))

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("device_check: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    budget = Budget(args.budget_min * 60)
    parts = {name: part_record(name) for name in PART_KEYS}
    args.quick = args.quick or args.dry_run
    result = {"schema": 1, "mode": {"device": device, "quick": args.quick, "dry_run": args.dry_run,
                                    "budget_s": args.budget_min * 60, "wheels_unpacked": added},
              "environment": environment(), "parts": parts, "wall_s": None}
    ctx = {"out": out, "device": device, "quick": args.quick, "dry_run": args.dry_run, "budget": budget,
           "env": child_env(site),
           "cores": len(os.sched_getaffinity(0)), "results": parts}
    runners = {"step_profile": step_profile, "cuda_tests": cuda_tests, "throughput": throughput, "loader": loader,
               "end_to_end": end_to_end, "grid_wall": lambda c: device_grid.grid_wall_part(c, run_logged),
               "smoke": smoke, "grid": grid}
    min_seconds = {"step_profile": 20, "smoke": 60, "cuda_tests": 20, "throughput": 30, "loader": 15,
                   "end_to_end": 45, "grid_wall": 10 if args.dry_run or device != "cuda" else 120, "grid": 10}
    dry_skips = {"cuda_tests", "throughput", "end_to_end"}  # measurements only: nothing to plan

    def write() -> None:
        result["wall_s"] = time.monotonic() - started
        (out / "device_check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (out / "device_check.md").write_text(summary_markdown(result))

    for name, run in runners.items():
        record = parts[name]
        t0 = time.perf_counter()
        try:
            if name not in args.parts:
                raise Skip("not selected (--parts)")
            if args.dry_run and name in dry_skips:
                raise Skip("dry run: this part measures only")
            lacking = missing(name)
            if lacking:
                raise Skip(f"needs {', '.join(lacking)}, not importable here (see --wheels)")
            if not budget.allows(min_seconds[name]):
                raise Skip(f"time budget: {budget.left():.0f} s left")
            if name == "grid_wall" and args.quick and not args.dry_run:
                raise Skip("quick mode: --dry-run plans it (tests/test_device_check.py)")
            found = run(ctx)
            unknown = set(found) - set(record)
            if unknown:  # a key the template lacks would differ between modes
                raise RuntimeError(f"part {name} returned keys outside PART_KEYS: {sorted(unknown)}")
            record.update(found)
            record["status"] = record["status"] or "ok"
        except Skip as exc:
            record.update(status="skipped", reason=str(exc))
        except Exception as exc:  # one part's failure must not cost the others their minutes
            log.exception("part %s failed", name)
            record.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
        record["wall_s"] = time.perf_counter() - t0
        print(f"device_check: {name}: {record['status']}"
              f"{' (' + record['reason'] + ')' if record['reason'] else ''} in {record['wall_s']:.0f} s", flush=True)
        write()
    print(f"device_check: wrote {out / 'device_check.json'} and {out / 'device_check.md'} "
          f"in {result['wall_s']:.0f} s", flush=True)
    return 1 if any(p["status"] == "failed" for p in parts.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
