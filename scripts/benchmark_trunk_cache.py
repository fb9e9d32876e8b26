#!/usr/bin/env python
"""What a frozen-trunk cache would save on one demo run (a measurement, not wired into the trainer).

The idea: the stem and the frozen stages (BatchNorm frozen) are a fixed function, so a fixed set of V
augmented views per training image could go through them once, and each epoch would pick one stored
view per slot instead of reading, augmenting and running the frozen stages again. That changes the
augmentation (V views per image instead of a fresh view per slot), so it would change the numbers.

This script measures, in process CPU seconds on the run's configuration:
- per training iteration, what the cache replaces: the loader (cache rows + drawn parameters), the
  augmentation and the frozen stages on every stream's views (the live path, as the trainer runs it);
- the cache's build: V views per image, augmented and sent through the frozen stages once;
- per iteration with the cache: gathering the stored outputs of the step's views;
and prints the estimated saving for a whole run. Methods whose images are mixed before the backbone
(image-level Stitch-Up, Mix-Up, DivideMix's MixMatch) or whose whole backbone trains cannot use it.

    python scripts/benchmark_trunk_cache.py --method ours --views 4 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="ours")
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--views", type=int, nargs="*", default=[4, 8], help="stored views per image (V)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of the live path to time")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    import numpy as np
    import torch

    from noisymlt.pipeline.config import load_params, resolve_run
    from noisymlt.training.loaders import CacheRows, EpochPlan, stream_loader
    from noisymlt.models.twobranch import TwoBranch
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.augment import augment, draw_train_params
    from noisymlt.training.trainer import Trainer

    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    cfg = resolve_run(params, "toy", args.method, args.gamma, args.seed)
    tcfg = cfg["train"]
    data = REPO / "data" / "toy"
    images = REPO / image_root(params, "toy", "train")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(cfg, train_labels=data / "noisy" / f"g{args.gamma:g}_s{args.seed}.parquet",
                          test_labels=data / "test_labels.parquet", split=data / "class_split.json",
                          train_images=images, test_images=images, out_dir=Path(scratch), device="cpu",
                          progress=False, train_cache=data / "cache" / "train.npy",
                          test_cache=data / "cache" / "test.npy")
    model = trainer.model
    model.train()
    if isinstance(model, TwoBranch):
        if not model.shares_frozen_trunk:
            raise SystemExit(f"{args.method}: the branches share no frozen trunk")
        trunk = model.frozen_features
    else:
        if not getattr(model, "splittable", False):
            raise SystemExit(f"{args.method}: no frozen prefix (trainable: {tcfg['trainable']})")
        trunk = model.frozen_prefix

    def channels_last(x):
        return x.contiguous(memory_format=torch.channels_last) if tcfg["channels_last"] else x

    # the live path: loader + augmentation + frozen stages, per iteration
    plans = [EpochPlan(s, cfg["seed"], trainer.iters) for s in trainer.streams]
    dataset = trainer.train_dataset()
    loaders = [stream_loader(dataset, None, 0, False) for _ in plans]
    load_s = aug_s = trunk_s = 0.0
    iterations = 0
    for epoch in range(args.epochs):
        for loader, plan in zip(loaders, plans):
            loader.batch_sampler.batches = plan.batches(epoch)
        t = time.process_time()
        for raw in zip(*loaders):
            t1 = time.process_time()
            load_s += t1 - t
            batches = [trainer.to_device(b) for b in raw]
            t2 = time.process_time()
            aug_s += t2 - t1
            with trainer.autocast():
                for b in batches:
                    trunk(b["images"].flatten(0, 1))
            t = time.process_time()
            trunk_s += t - t2
            iterations += 1
    views_per_iter = sum(s.batch_size * s.k for s in trainer.streams)
    run_iters = trainer.iters * tcfg["epochs"]
    live = (load_s + aug_s + trunk_s) / iterations
    print(f"{args.method}: {run_iters} iterations a run, {views_per_iter} views an iteration; live path per "
          f"iteration (CPU ms): loader {1000 * load_s / iterations:.1f}, augmentation {1000 * aug_s / iterations:.1f}, "
          f"frozen stages {1000 * trunk_s / iterations:.1f}; {live * run_iters:.2f} CPU s a run")

    rows = CacheRows(trainer.caches["train"])
    n, s = len(rows), rows.size
    for v in args.views:
        rng = np.random.default_rng([args.seed, v])
        t = time.process_time()
        stored = []
        with torch.no_grad(), trainer.autocast():
            for start in range(0, n, 128):  # V views of every image, in batches of 128 images
                raw = torch.from_numpy(np.array(rows.array[start:start + 128])).permute(0, 3, 1, 2)
                for _ in range(v):
                    p = torch.from_numpy(np.stack([draw_train_params(rng, s, s, tcfg["photometric"])
                                                   for _ in range(len(raw))]))
                    stored.append(trunk(channels_last(augment(raw, p, tcfg["image_size"], tcfg["photometric"]))))
        build = time.process_time() - t
        table = torch.cat(stored)  # the real thing would index it by (image, view)
        pick = torch.from_numpy(np.random.default_rng(0).integers(0, len(table), size=views_per_iter))
        t = time.process_time()
        for _ in range(50):
            channels_last(table.index_select(0, pick))
        gather = (time.process_time() - t) / 50
        cached = build + gather * run_iters
        print(f"  V={v}: build {build:.2f} CPU s ({table.numel() * table.element_size() / 2**20:.0f} MiB, "
              f"{table.dtype}), gather {1000 * gather:.2f} ms an iteration; a run: {cached:.2f} CPU s instead of "
              f"{live * run_iters:.2f}, saving {live * run_iters - cached:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
