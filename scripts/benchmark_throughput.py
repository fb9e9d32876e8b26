#!/usr/bin/env python
"""Training-step throughput of methods against a bare backbone step, at the same batch and precision.

Measures the compute of one optimisation step (forward, backward, clipping, SGD) on synthetic batches
shaped exactly as each method's data streams (batch size, Stitch-Up views), so data loading is left out:
the point is what a method's extra machinery costs over training the backbone alone. The bare backbone
trains the same stages as the methods (BatchNorm frozen likewise) with a linear classifier, on as many
images per step as the method it is compared with. All nets start from one set of (random) backbone weights, as they would from one
pretrained file, so that methods that share identical frozen stages do so here too.

    python scripts/benchmark_throughput.py                         # paper scale: ResNet-50 @ 224, VOC
    python scripts/benchmark_throughput.py --device cpu --image-size 112 --balanced-batch-size 64 --iters 2
    python scripts/benchmark_throughput.py --params params.yaml workflow/profiles/demo/params.yaml --dataset toy

Prints a table and writes JSON with --json: per method, ms per step, training images per step and per
second (every anchor and Stitch-Up partner of every branch counted) and the cost per training image
relative to the bare backbone, and on CUDA the memory one run of it needs (peak_gpu_mem_mib); the
device, precision and library versions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from noisymlt.methods import FAMILIES, TrainContext
from noisymlt.config import load_params, resolve_run
from noisymlt.training.devices import select_device


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
                num_classes: int, compile: bool | str = False):
    """(one training step of ``method`` on synthetic batches, images it processes); ``compile``: the model's
    stages compiled as ``train.compile`` does. The optimiser is the trainer's (fused SGD on CUDA)."""
    from noisymlt.training.schedule import build_optimizer
    from noisymlt.training.speed import compile_model, mark_step

    cfg = resolve_run(params, dataset, method, 0.5, 0)
    tcfg = cfg["train"]
    torch.manual_seed(0)
    noisy = synthetic_labels(num_images, num_classes).to(device)
    split = {"head": list(range(0, num_classes // 3)), "medium": list(range(num_classes // 3, 2 * num_classes // 3)),
             "tail": list(range(2 * num_classes // 3, num_classes))}
    ctx = TrainContext(cfg, noisy, split, device, num_images // tcfg["batch_size"], extra={})
    m = FAMILIES[cfg["method_cfg"]["family"]](ctx)
    model = m.build_model().to(device)
    epoch = 0
    if cfg["method_cfg"]["family"] == "dividemix":  # time the MixMatch step after warm-up, not the warm-up
        m.prob = torch.rand(2, num_images, generator=torch.Generator().manual_seed(0)).to(device)
        epoch = m.warmup
    channels_last = tcfg["channels_last"]
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    # the trainer's SGD, over every trainable parameter in one group at a small rate
    sgd = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-4, "new_layers_lr_mult": 1.0}
    opt, _ = build_optimizer(model, sgd, {}, 1, device)
    if compile:  # True: the trainer's mode; a string: that torch.compile mode
        compile_model(model, device, compile if isinstance(compile, str) else None)
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
        mark_step(device, bool(compile))
        with autocast(device, tcfg["precision"]):
            loss, _ = m.training_loss(model, batches, epoch, 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, tcfg["grad_clip"] or 1e9)
        opt.step()

    return step, images_per_step


def bare_backbone_step(tcfg: dict, device: torch.device, num_classes: int, batch: int):
    """The reference: the configured backbone (its trainable stages, frozen BatchNorm as configured) with
    global pooling and a linear classifier, BCE, on ``batch`` images per step."""
    from noisymlt.models.backbones import apply_trainable, build_backbone, freeze_batchnorm

    torch.manual_seed(0)
    backbone = build_backbone(tcfg["backbone"], weights_path=tcfg.get("weights_path"))
    apply_trainable(backbone, tcfg["trainable"])
    model = torch.nn.Sequential(backbone, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(backbone.out_dim, num_classes)).to(device)
    model.train()
    if tcfg["frozen_bn"]:
        freeze_batchnorm(backbone)
    channels_last = tcfg["channels_last"]
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    b, size = batch, tcfg["image_size"]
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


def with_peak_memory(build, device: torch.device):
    """``build()``'s (step, images) and, on CUDA, the memory that one run of it needs in MiB: everything
    allocated from building its net to the end of two steps (weights, batches, gradients, optimiser
    state, a step's activations), nets built earlier excluded; None on other devices."""
    if device.type != "cuda":
        return (*build(), None)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step, images = build()
    for _ in range(2):
        step()
    torch.cuda.synchronize(device)
    return step, images, (torch.cuda.max_memory_allocated(device) - base) / 2**20


def one_weights_file(tcfg: dict, directory: str) -> str:
    """Random backbone weights saved once, loaded by every net (as one pretrained file would be)."""
    from noisymlt.models.backbones import build_backbone

    torch.manual_seed(0)
    trunk = build_backbone(tcfg["backbone"])
    state = {}
    for prefix, module in (("conv1.", trunk.stem[0]), ("bn1.", trunk.stem[1])):
        state.update({prefix + k: v for k, v in module.state_dict().items()})
    for name in ("layer1", "layer2", "layer3", "layer4"):
        state.update({f"{name}.{k}": v for k, v in getattr(trunk, name).state_dict().items()})
    path = f"{directory}/{tcfg['backbone']}.pt"
    torch.save(state, path)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", nargs="+", default=["params.yaml"], help="params files, layered")
    ap.add_argument("--dataset", default="voc", help="dataset block whose settings apply")
    ap.add_argument("--methods", nargs="+", default=["erm", "db_focal", "bbn", "dividemix", "ours"])
    ap.add_argument("--backbone", help="override train.backbone (resnet50, resnet18, resnet_tiny)")
    ap.add_argument("--image-size", type=int, help="override train.image_size")
    ap.add_argument("--batch-size", type=int, help="override train.batch_size (random branch, single-branch methods)")
    ap.add_argument("--balanced-batch-size", type=int, help="override train.balanced_batch_size")
    ap.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="override train.precision (GPU only)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--iters", type=int, default=20, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    ap.add_argument("--num-images", type=int, default=1142, help="size of the synthetic train set (VOC-MLT: 1142)")
    ap.add_argument("--num-classes", type=int, default=20)
    ap.add_argument("--barrier", help="folder: once the nets are built, write PID.ready there and wait for a file "
                    "'go' before timing (concurrent processes sharing one GPU then time the same seconds)")
    ap.add_argument("--json", "--out", dest="json", help="write the results as JSON")
    args = ap.parse_args()

    params = load_params(*args.params)
    overrides = {"backbone": args.backbone, "image_size": args.image_size, "batch_size": args.batch_size,
                 "balanced_batch_size": args.balanced_batch_size, "precision": args.precision}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    device = select_device(args.device)
    if device.type == "cpu":
        # Denormal floats (freshly initialised nets on random inputs produce them) slow CPU kernels
        # several-fold and would distort the comparison; the trainer flushes them too.
        torch.set_flush_denormal(True)
    with tempfile.TemporaryDirectory() as tmp:
        # Timing does not depend on the weights: one random file, never an ImageNet download.
        base = {**resolve_run(params, args.dataset, args.methods[0], 0.5, 0)["train"], **overrides}
        overrides["weights_path"] = one_weights_file(base, tmp)
        overrides["pretrained"] = False
        params["train"].update(overrides)
        for schedule in params["schedules"].values():  # a schedule's keys would win over the overrides
            schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in overrides}
        methods = [m for m in args.methods if m in params["methods"]]
        for method in sorted(set(args.methods) - set(methods)):
            print(f"skipping {method}: not defined in {' + '.join(args.params)}")
        configs = {m: resolve_run(params, args.dataset, m, 0.5, 0)["train"] for m in methods}
        tcfg = configs[methods[0]]
        peak_mib = {}
        method_steps = {}
        for m in methods:
            step, images, peak_mib[m] = with_peak_memory(
                lambda m=m: method_step(params, args.dataset, m, device, args.num_images, args.num_classes), device)
            method_steps[m] = (step, images)
        # One bare reference per (trainable policy, images per step) in use: [DB]'s layer2 on or [CL]'s
        # layer4 only, at the method's own images per step, since the cost per image of a step depends on
        # its batch (on CPU a step of 576 images costs ~1.7x more per image than one of 32).
        bare_of = {m: f"bare backbone ({c['trainable']}, {method_steps[m][1]} img)" for m, c in configs.items()}
        steps = {}
        for m in methods:
            if bare_of[m] not in steps:
                step, images, peak_mib[bare_of[m]] = with_peak_memory(
                    lambda m=m: bare_backbone_step(configs[m], device, args.num_classes, method_steps[m][1]), device)
                steps[bare_of[m]] = (step, images)
        steps = {**dict(sorted(steps.items())), **method_steps}
        if args.barrier:
            (Path(args.barrier) / f"{os.getpid()}.ready").touch()
            while not (Path(args.barrier) / "go").exists():
                time.sleep(0.05)
        # Interleaved rounds, median per method: drifts of clock speed or background load hit all alike.
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, (step, _) in steps.items():
                times[name].append(timed_steps(step, args.iters, args.warmup, device))
    rows = []
    for name, (_, images) in steps.items():
        sec = float(np.median(times[name]))
        rows.append({"method": name, "ms_per_step": 1000 * sec, "train_images_per_step": images,
                     "train_images_per_s": images / sec, "peak_gpu_mem_mib": peak_mib[name]})
    by_name = {r["method"]: r for r in rows}
    for r in rows:
        bare = by_name[bare_of.get(r["method"], r["method"])]
        r["trainable"] = (configs[r["method"]] if r["method"] in configs else
                          configs[next(m for m, b in bare_of.items() if b == r["method"])])["trainable"]
        r["cost_per_image_vs_bare"] = (r["ms_per_step"] / r["train_images_per_step"]) / (
            bare["ms_per_step"] / bare["train_images_per_step"])
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    precision = tcfg["precision"] if device.type == "cuda" else "fp32"
    print(f"device: {name}; backbone {tcfg['backbone']} @ {tcfg['image_size']}px, "
          f"precision {precision}, random batch {tcfg['batch_size']}, balanced batch {tcfg['balanced_batch_size']}")
    print(f"{'method':<34}{'img/step':>10}{'ms/step':>12}{'img/s':>10}{'cost/img vs bare':>19}{'peak MiB':>10}")
    for r in rows:
        peak = "-" if r["peak_gpu_mem_mib"] is None else f"{r['peak_gpu_mem_mib']:.0f}"
        print(f"{r['method']:<34}{r['train_images_per_step']:>10}{r['ms_per_step']:>12.1f}"
              f"{r['train_images_per_s']:>10.1f}{r['cost_per_image_vs_bare']:>18.2f}x{peak:>10}")
    if args.json:
        import torchvision

        from noisymlt import __version__

        info = {"device": name, "precision": precision, "train": tcfg, "rows": rows, "iters": args.iters,
                "rounds": args.rounds, "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                                    "torchvision": torchvision.__version__, "noisymlt": __version__}}
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
