#!/usr/bin/env python
"""The SLURM profile's memory and time requests for train jobs, derived from measurements, not guessed.

Two steps; the second reads what the first (and the GPU check) wrote:

  measure   Host memory of one train job per method of the paper grid at the paper's shapes: ResNet-50 at 224,
            batches 32 / balanced 256, the image cache at 256 px, loader workers from the SLURM profile's 6
            threads. Each method trains two one-iteration epochs (DivideMix's second one co-divides) on a VOC
            stand-in (the toy generator in VOC's layout) in its own `noisymlt train` process, on the CPU, with the
            loader processes a GPU job of the profile gets (its 6 threads less the main process). The peak is the summed PSS (proportional set size: a page shared by the job's processes counts once,
            as a cgroup charges it) of the job and its loader processes, sampled every 0.2 s. The images of
            the real caches are not in the stand-in: their bytes (memory-mapped, touched as the job reads
            them) are added in `derive`. On a GPU the activations move to the card: the CPU peak bounds them.
  derive    Requests from those peaks and from the GPU check (docs/benchmarks/device_check_*.json): for memory,
            the largest peak plus the largest dataset's caches, with headroom; for time, the longest run the
            workflow plans (scripts/gridcost.py: iterations from the trainer's own planning code), priced
            at the measured step cost of its method family, or at the loader's measured rate when that is
            slower, plus its prediction passes (test set, training set for the fit record, DivideMix's
            co-divide), with headroom for a slower card.

    python scripts/slurm_requests.py measure --json docs/benchmarks/train_memory_cpu.json      # ~15 min, 2 cores
    python scripts/slurm_requests.py derive --memory docs/benchmarks/train_memory_cpu.json \\
        --device-check docs/benchmarks/device_check_h200.json --json docs/benchmarks/slurm_requests.json

tests/test_slurm_requests.py checks that workflow/profiles/slurm/config.yaml asks for at least what `derive`
gives from the committed measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "scripts"))  # gridcost

PROFILE_THREADS = 6  # workflow/profiles/slurm/config.yaml set-threads: train
CACHE_SIZE = 256  # params.yaml train.cache_size
# Headroom, choices rather than measurements: memory x1.5 (allocator and library differences between
# machines, CUDA's own host memory); time x4 (a card slower than the H200 measured: an A100's dense bf16 peak is
# about a third of an H200's; job start-up, checkpoints, loading stalls, a busy file system), rounded up to half
# hours.
MEMORY_HEADROOM = 1.5
TIME_HEADROOM = 4.0
# Images the real caches hold: the published subsets and test sets of the paper's kinds (noisymlt.data.kinds)
PAPER_KINDS = ("voc", "coco")


# ---------------------------------------------------------------------------------------------- measure

def _stand_in(work: Path) -> dict:
    """A VOC-layout stand-in: labels, long-tailed subset, noisy copy (gamma 0.5, seed 0), caches at 256 px."""
    from noisymlt.data.imagecache import build_cache
    from noisymlt.data.labels import split_from_counts, write_class_split, write_labels
    from noisymlt.data.longtail import pareto_subsample
    from noisymlt.data.noise import make_noisy_table
    from noisymlt.data.toy import make_voc_standin
    from noisymlt.data.voc import parse_voc

    raw = make_voc_standin(work / "raw", seed=0, n_trainval=600, n_test=64, image_size=64)
    source = parse_voc(raw / "VOCdevkit/VOC2012", "trainval")
    train = source.subset(pareto_subsample(source.labels, b=6, max_count=100, min_count=4, seed=0))
    files = {"train": work / "train.parquet", "test": work / "test.parquet", "split": work / "split.json",
             "noisy": work / "noisy.parquet", "train_images": raw / "VOCdevkit/VOC2012",
             "test_images": raw / "VOCdevkit/VOC2007"}
    write_labels(train, files["train"])
    write_labels(parse_voc(raw / "VOCdevkit/VOC2007", "test"), files["test"])
    write_class_split(split_from_counts(train.labels.sum(0)), files["split"])
    make_noisy_table(files["train"], 0.5, 0, files["noisy"])
    for part, table, images in (("train", files["train"], files["train_images"]),
                                ("test", files["test"], files["test_images"])):
        files[f"{part}_cache"] = work / f"{part}_cache.npy"
        build_cache(table, images, CACHE_SIZE, files[f"{part}_cache"], progress=False)
    files["images"] = len(train.image_ids)
    return files


def _tree_pss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(args: argparse.Namespace) -> dict:
    from noisymlt.config import deep_merge, load_params, resolve_run

    params = load_params(REPO / "params.yaml")
    work = Path(tempfile.mkdtemp(prefix="slurm_requests_"))
    files = _stand_in(work)
    stand_in = {"voc": {"kind": "voc", "toy": {"seed": 0, "n_trainval": 600, "n_test": 64, "size": 64}}}
    # two one-iteration epochs, the lr stepping after the first: DivideMix's auto warm-up then ends there and its
    # second epoch co-divides; no ImageNet file to fetch (the weights' bytes do not change the memory)
    short = {"pretrained": False, "max_iters_per_epoch": 1, "epochs": 2, "lr_steps": [1], "long_warmup": True}
    params = deep_merge(params, {"datasets": stand_in, "train": short})
    for schedule in params["schedules"].values():  # a schedule's keys would win over the train block
        schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in short}
    # a clean-then-retrain method trains its `of` method's recipe on a table of the same size: that method's peak
    methods = args.methods or [m for m in params["grid"]["methods"] if not params["methods"][m].get("clean")]
    # the loader processes of the profile's GPU job (its threads less the main process), here beside the
    # torch threads that compute on the CPU
    workers = PROFILE_THREADS - 1
    cores = workers + int(params["train"]["cpu_threads"])
    rows = {}
    for method in methods:
        cfg = resolve_run(params, "voc", method, 0.5, 0)
        if cfg["method_cfg"].get("embeddings_file"):  # the stand-in has no GloVe file; the vectors are 120 KB
            cfg["method_cfg"]["embeddings"] = "random"
            cfg["method_cfg"].pop("embeddings_file")
        config = work / f"{method}.json"
        config.write_text(json.dumps(cfg))
        cmd = [sys.executable, "-m", "noisymlt", "train", "--run-config", str(config),
               "--train-labels", str(files["noisy"]), "--test-labels", str(files["test"]), "--split", str(files["split"]),
               "--train-images", str(files["train_images"]), "--test-images", str(files["test_images"]),
               "--train-cache", str(files["train_cache"]), "--test-cache", str(files["test_cache"]),
               "--out", str(work / "runs" / method), "--device", "cpu", "--cores", str(cores), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        started = time.monotonic()
        with open(work / f"{method}.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            peak = 0
            while proc.poll() is None:
                peak = max(peak, _tree_pss(proc.pid))
                time.sleep(0.2)
        if proc.returncode != 0:
            raise SystemExit(f"{method}: train failed, see {work / f'{method}.log'}")
        timing = json.loads((work / "runs" / method / "manifest.timing.json").read_text())
        rows[method] = {"peak_pss_mib": round(peak / 2**20), "seconds": round(time.monotonic() - started, 1),
                        "loader_workers": timing["loader_workers"]}
        print(f"{method}: peak {rows[method]['peak_pss_mib']} MiB (job + {timing['loader_workers']} loader "
              f"processes), {rows[method]['seconds']} s", flush=True)
    shutil.rmtree(work)  # gigabytes of stand-in images and runs; a failed method above keeps them for its log
    import platform

    import torch

    return {"what": "peak summed PSS of one train job per method at paper shapes, CPU, VOC stand-in",
            "stand_in_images": files["images"], "cache_size": CACHE_SIZE, "threads": PROFILE_THREADS,
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "cpu_threads": params["train"]["cpu_threads"], "methods": rows}


# ---------------------------------------------------------------------------------------------- derive

def _run_minutes(job: dict, throughput: dict, loader_rate: float, images: int, test_images: int) -> dict:
    from gridcost import FAMILY_PROXY

    proxy = FAMILY_PROXY[job["family"]]
    row = throughput[proxy]
    steps_s = job["iterations"] * job["images_per_step"] * row["ms_per_step"] / row["train_images_per_step"] / 1e3
    loader_s = job["iterations"] * job["images_per_step"] / loader_rate
    # prediction passes go through the same loader; the test set and the fit record's training set, and for
    # DivideMix two nets over the training set at every epoch after its warm-up (at most all of them)
    passes = test_images + images + (2 * job["epochs"] * images if job["family"] == "dividemix" else 0)
    predict_s = passes / min(loader_rate, throughput["erm"]["train_images_per_s"])
    return {"steps_min": steps_s / 60, "loader_min": loader_s / 60, "predict_min": predict_s / 60,
            "minutes": (max(steps_s, loader_s) + predict_s) / 60}


def derive(args: argparse.Namespace) -> dict:
    from noisymlt.data.kinds import kind_of
    import gridcost
    from noisymlt.config import load_params

    memory = json.loads(Path(args.memory).read_text())
    check = json.loads(Path(args.device_check).read_text())
    throughput = check["parts"]["throughput"]["methods"]
    loader_rate = float(check["parts"]["loader"]["best"]["img_per_s"])
    params = load_params(REPO / "params.yaml")
    jobs = gridcost.plan_grid(params, data_root=REPO / "data")
    longest, per_method = None, {}
    for job in jobs:
        images = kind_of(job["dataset"]).published_subset["images"]
        cost = _run_minutes(job, throughput, loader_rate, images, job["test_images"])
        key = job["method"]
        if key not in per_method or cost["minutes"] > per_method[key]["minutes"]:
            per_method[key] = {"dataset": job["dataset"], "iterations": job["iterations"], **cost}
        if longest is None or cost["minutes"] > longest["minutes"]:
            longest = {"method": key, "dataset": job["dataset"], "candidate": job.get("candidate"),
                       "iterations": job["iterations"], "images_per_step": job["images_per_step"], **cost}
    caches_mib = {d: (kind_of(d).published_subset["images"] + kind_of(d).test_images) * CACHE_SIZE ** 2 * 3 / 2**20
                  for d in PAPER_KINDS}
    peak_method = max(memory["methods"], key=lambda m: memory["methods"][m]["peak_pss_mib"])
    peak = memory["methods"][peak_method]["peak_pss_mib"]
    need_mib = peak + max(caches_mib.values())
    return {
        "memory": {"measured": memory["what"], "largest": {"method": peak_method, "peak_pss_mib": peak},
                   "caches_mib": {d: round(v) for d, v in caches_mib.items()}, "need_mib": round(need_mib),
                   "headroom": MEMORY_HEADROOM,
                   "request_mem_mb": int(math.ceil(need_mib * MEMORY_HEADROOM * 1.048576 / 1000) * 1000)},
        "time": {"device": check["environment"].get("gpu_name"), "loader_img_per_s": loader_rate,
                 "longest": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in longest.items()},
                 "per_method_minutes": {m: round(v["minutes"], 2) for m, v in per_method.items()},
                 "headroom": TIME_HEADROOM,
                 "request_runtime_min": int(math.ceil(longest["minutes"] * TIME_HEADROOM / 30) * 30)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure", help="peak host memory of one train job per method (CPU, paper shapes)")
    m.add_argument("--json", required=True, help="where to write the measurements")
    m.add_argument("--methods", nargs="+", help="only these methods (default: the paper grid's)")
    d = sub.add_parser("derive", help="the train jobs' SLURM requests from the measurements")
    d.add_argument("--memory", required=True, help="the JSON `measure` wrote")
    d.add_argument("--device-check", required=True, help="a GPU check's device_check.json (throughput, loader)")
    d.add_argument("--json", help="where to write the requests (else printed)")
    args = ap.parse_args()
    result = measure(args) if args.step == "measure" else derive(args)
    text = json.dumps(result, indent=1) + "\n"
    if args.json:
        Path(args.json).write_text(text)
    print(text if args.step == "derive" else f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
