#!/usr/bin/env python
"""Training-step throughput of methods against a bare backbone step, at the same batch and precision.

Measures the compute of one optimisation step (forward, backward, clipping, SGD) on synthetic batches
shaped exactly as each method's data streams (batch size, Stitch-Up views), so data loading is left out:
the point is what a method's extra machinery costs over training the backbone alone.

    python scripts/benchmark_throughput.py                         # paper scale: ResNet-50 @ 224, VOC
    python scripts/benchmark_throughput.py --device cpu --iters 3  # a quick CPU reading
    python scripts/benchmark_throughput.py --params params.yaml workflow/profiles/demo/params.yaml --dataset toy

Prints a table and writes JSON with --out. "images/s" counts every image the step processes (both
branches, all Stitch-Up views).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time

import numpy as np
import torch

from noisymlt.config import load_params, resolve_run
from noisymlt.devices import select_device
from noisymlt.methods import FAMILIES, TrainContext


def synthetic_labels(n: int, c: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < np.linspace(0.4, 0.01, c)).astype(np.float32)
    y[np.arange(n), rng.integers(0, c, n)] = 1.0  # every image has a positive
    return torch.from_numpy(y)


def autocast(device: torch.device, precision: str):
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def timed_steps(step, iters: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / iters


def method_step(params: dict, dataset: str, method: str, device: torch.device, num_images: int,
                num_classes: int):
    """(one training step of ``method`` on synthetic batches, images it processes)."""
    cfg = resolve_run(params, dataset, method, 0.5, 0)
    tcfg = cfg["train"]
    torch.manual_seed(0)
    noisy = synthetic_labels(num_images, num_classes).to(device)
    split = {"head": list(range(0, num_classes // 3)), "medium": list(range(num_classes // 3, 2 * num_classes // 3)),
             "tail": list(range(2 * num_classes // 3, num_classes))}
    ctx = TrainContext(cfg, noisy, split, device, num_images // tcfg["batch_size"], extra={})
    m = FAMILIES[cfg["method_cfg"]["family"]](ctx)
    model = m.build_model().to(device)
    channels_last = device.type == "cuda" and tcfg["channels_last"]
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=1e-3, momentum=0.9, weight_decay=1e-4)
    size = tcfg["image_size"]
    gen = torch.Generator().manual_seed(0)
    batches, images_per_step = {}, 0
    for s in m.streams():
        b, k = s.batch_size, s.k
        images = torch.randn(b, k, 3, size, size, generator=gen).to(device)
        if channels_last:
            images = images.flatten(0, 1).contiguous(memory_format=torch.channels_last).view(images.shape)
        batches[s.name] = {"images": images, "index": torch.randint(0, num_images, (b, k), generator=gen).to(device),
                           "stitched": torch.ones(b, dtype=torch.bool, device=device)}
        images_per_step += b * k

    def step():
        with autocast(device, tcfg["precision"]):
            loss, _ = m.training_loss(model, batches, 0, 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, tcfg["grad_clip"] or 1e9)
        opt.step()

    return step, images_per_step


def bare_backbone_step(params: dict, dataset: str, device: torch.device, num_classes: int):
    """The reference: the configured backbone + a linear classifier, every weight trained, BCE."""
    from noisymlt.models.backbones import build_backbone

    tcfg = resolve_run(params, dataset, next(iter(params["methods"])), 0.5, 0)["train"]
    torch.manual_seed(0)
    backbone = build_backbone(tcfg["backbone"], pretrained=False)
    model = torch.nn.Sequential(backbone, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(backbone.out_dim, num_classes)).to(device)
    channels_last = device.type == "cuda" and tcfg["channels_last"]
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    b, size = tcfg["batch_size"], tcfg["image_size"]
    x = torch.randn(b, 3, size, size).to(device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = (torch.rand(b, num_classes) < 0.1).float().to(device)

    def step():
        with autocast(device, tcfg["precision"]):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", nargs="+", default=["params.yaml"], help="params files, layered")
    ap.add_argument("--dataset", default="voc", help="dataset block whose settings apply")
    ap.add_argument("--methods", nargs="+", default=["erm", "db_focal", "ours"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    ap.add_argument("--num-images", type=int, default=1142, help="size of the synthetic train set (VOC-MLT: 1142)")
    ap.add_argument("--num-classes", type=int, default=20)
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()

    params = load_params(*args.params)
    # Timing does not depend on the weights: never download ImageNet weights for a benchmark.
    params["train"].update(pretrained=False, weights_path=None)
    device = select_device(args.device)
    if device.type == "cpu":
        # Denormal floats (freshly initialised nets on random inputs produce them) slow CPU kernels
        # several-fold and would distort the comparison; the trainer flushes them too.
        torch.set_flush_denormal(True)
    steps = {"bare backbone": bare_backbone_step(params, args.dataset, device, args.num_classes)}
    for method in args.methods:
        if method not in params["methods"]:
            print(f"skipping {method}: not defined in {' + '.join(args.params)}")
            continue
        steps[method] = method_step(params, args.dataset, method, device, args.num_images, args.num_classes)
    # Interleaved rounds, median per method: drifts of clock speed or background load hit all alike.
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (step, _) in steps.items():
            times[name].append(timed_steps(step, args.iters, args.warmup, device))
    rows = []
    for name, (_, images) in steps.items():
        sec = float(np.median(times[name]))
        rows.append({"method": name, "ms_per_iter": 1000 * sec, "images_per_s": images / sec,
                     "images_per_step": images})
    bare = rows[0]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    tcfg = resolve_run(params, args.dataset, next(iter(params["methods"])), 0.5, 0)["train"]
    print(f"device: {name}; backbone {tcfg['backbone']} @ {tcfg['image_size']}px, precision "
          f"{tcfg['precision'] if device.type == 'cuda' else 'fp32'}, random batch {tcfg['batch_size']}, "
          f"balanced batch {tcfg['balanced_batch_size']}")
    print(f"{'method':<16}{'img/step':>10}{'ms/iter':>12}{'images/s':>12}{'ms/iter vs bare':>18}")
    for r in rows:
        r["ms_ratio_vs_bare"] = r["ms_per_iter"] / bare["ms_per_iter"]
        print(f"{r['method']:<16}{r['images_per_step']:>10}{r['ms_per_iter']:>12.1f}{r['images_per_s']:>12.1f}"
              f"{r['ms_ratio_vs_bare']:>17.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "train": tcfg, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
