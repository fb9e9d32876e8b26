#!/usr/bin/env python
"""Where a training step spends its time, eager against compiled (``train.compile``), per method.

For ERM, DB-Focal and Ours (default) at the params' shapes (paper scale: ResNet-50 @ 224, batch 32 and the
balanced 256, bf16 on a GPU) on synthetic batches shaped as each method's streams (scripts/benchmark_throughput.py
builds them, with the trainer's fused SGD on CUDA): ms per step and images per second, eager and compiled,
then the torch profiler over a few steps (a compiled mode that fails with CUDA graphs is measured again without
them, as ``compiled_no_cudagraphs``): the device's busy time per step (kernels) against the step's
wall time (the rest is launches, Python and waits), kernel launches per step, and the operators that take
the most time.

    python scripts/step_profile.py --json step_profile.json                 # GPU, paper shapes
    python scripts/step_profile.py --quick --device cpu --json out.json      # the demo's shapes, seconds (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TOP = 12  # operators listed per method and mode


def throughput_module():
    spec = importlib.util.spec_from_file_location("benchmark_throughput", REPO / "scripts" / "benchmark_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def profile_steps(step, steps: int, device: torch.device) -> dict:
    """The profiler's view of ``steps`` steps: device busy ms per step, launches per step, the top operators."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    wall_ms = (time.perf_counter() - t0) * 1000 / steps
    events = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))  # noqa: E731
    busy_ms = sum(dev(e) for e in events) / 1000 / steps
    launches = sum(e.count for e in events if "cudaLaunchKernel" in e.key or "cuLaunchKernel" in e.key) / steps
    key = dev if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    top = sorted(events, key=key, reverse=True)[:TOP]
    return {"profiled_ms_per_step": wall_ms, "device_busy_ms_per_step": busy_ms if device.type == "cuda" else None,
            "device_busy_share": busy_ms / wall_ms if device.type == "cuda" and wall_ms else None,
            "kernel_launches_per_step": launches if device.type == "cuda" else None,
            "top_ops": [{"op": e.key, "calls_per_step": e.count / steps,
                         "self_device_ms_per_step": dev(e) / 1000 / steps,
                         "self_cpu_ms_per_step": e.self_cpu_time_total / 1000 / steps} for e in top]}


def measure(bt, params: dict, dataset: str, method: str, mode: str, device: torch.device, args) -> dict:
    t0 = time.perf_counter()
    compile = {"eager": False, "compiled": True, "compiled_no_cudagraphs": "default"}[mode]
    step, images = bt.method_step(params, dataset, method, device, args.num_images, args.num_classes,
                                  compile=compile)
    for _ in range(args.warmup):  # compiles (and records the CUDA graphs) here
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ready_s = time.perf_counter() - t0
    ms = bt.timed_steps(step, args.iters, 0, device) * 1000
    row = {"ms_per_step": ms, "images_per_step": images, "images_per_s": images / ms * 1000,
           "build_and_warmup_s": ready_s, **profile_steps(step, args.profile_steps, device)}
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()  # the next method compiles afresh, not against this one's cache entries
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", nargs="+", default=["params.yaml"])
    ap.add_argument("--dataset", default="voc")
    ap.add_argument("--methods", nargs="+", default=["erm", "db_focal", "ours"])
    ap.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--iters", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation, CUDA graph capture)")
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--num-images", type=int, default=1142)
    ap.add_argument("--num-classes", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the demo's shapes, 2 steps each (a dry path for CI)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="skip what would start after this")
    ap.add_argument("--json")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from noisymlt.config import load_params
    from noisymlt.training.devices import select_device

    if args.quick:
        args.params = ["params.yaml", "workflow/profiles/demo/params.yaml"]
        args.dataset, args.iters, args.warmup, args.profile_steps, args.num_images = "toy", 2, 1, 1, 96
    device = select_device(args.device)
    bt = throughput_module()
    params = load_params(*[REPO / p for p in args.params])
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # as the trainer (random nets on random inputs make denormals)
    with tempfile.TemporaryDirectory() as tmp:
        # steps on images, as at paper scale; timing does not depend on the weights: one random file
        base = {**params["train"], "trunk_cache_views": 0}
        overrides = {"trunk_cache_views": 0, "pretrained": False, "weights_path": bt.one_weights_file(base, tmp)}
        params["train"].update(overrides)
        for schedule in params["schedules"].values():  # a schedule's keys would win over the overrides
            schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in overrides}
        results = run_all(bt, params, device, args)
    record = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "params": args.params, "dataset": args.dataset,
              "precision": params["train"]["precision"] if device.type == "cuda" else "fp32",
              "backbone": params["train"]["backbone"], "image_size": params["train"]["image_size"],
              "methods": results}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def run_all(bt, params: dict, device: torch.device, args) -> dict:
    started = time.monotonic()
    results: dict = {}
    for method in args.methods:
        results[method] = {}
        for mode in args.modes:
            if time.monotonic() - started > args.budget_s:
                results[method][mode] = {"skipped": "time budget"}
                continue
            for attempt in [mode] + (["compiled_no_cudagraphs"] if mode == "compiled" and device.type == "cuda" else []):
                try:
                    row = measure(bt, params, args.dataset, method, attempt, device, args)
                except Exception as exc:  # one failing mode must not cost the others their reading
                    results[method][attempt] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    print(f"{method:<9} {attempt}: failed: {exc}", flush=True)
                    torch._dynamo.reset()
                    continue
                results[method][attempt] = row
                print(f"{method:<9} {attempt:<8} {row['ms_per_step']:8.2f} ms/step {row['images_per_s']:9.1f} img/s "
                      f"(ready in {row['build_and_warmup_s']:.0f} s)", flush=True)
                break  # CUDA graphs worked: no need for the fallback
        compiled = [r["ms_per_step"] for k, r in results[method].items() if k.startswith("compiled") and "ms_per_step" in r]
        eager = results[method].get("eager", {}).get("ms_per_step")
        results[method]["compiled_speedup"] = eager / min(compiled) if eager and compiled else None
    return results


if __name__ == "__main__":
    raise SystemExit(main())
