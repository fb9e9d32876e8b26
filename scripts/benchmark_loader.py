#!/usr/bin/env python
"""Training-loader throughput: PIL decode per view (train.loader: pil) against the decoded-image cache
(train.loader: cache) and the training set on the device (train.device_images, rows device_images_bB), with the training transform (random crop, resize, photometric distortion, flip,
normalise) and nothing else, so the number is what the loader can feed a model.

    python scripts/benchmark_loader.py --json loader.json                        # both scenarios below
    python scripts/benchmark_loader.py --scenario voc --images 300 --workers 0 2

Scenarios: ``toy`` renders the embedded toy set (64 px glyph scenes, read at the demo's 32 px from a 40 px
cache); ``voc`` writes synthetic JPEGs of VOC-like sizes (500 x 375 and 375 x 500, quality 90) read at
224 px from a 256 px cache. Each (loader, workers) cell iterates one epoch of batches of the given size
(single views, as the random branch), after a warm-up batch; the cache is built once beforehand and its
build time is reported separately. On a GPU machine ``--device cuda`` also times the cache path with the
augmentation on the device (uint8 views transferred, augmented in batch there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from noisymlt.data.imagecache import build_cache
from noisymlt.data.labels import LabelTable, write_labels
from noisymlt.training.augment import augment
from noisymlt.training.loaders import CachedTrainImages, CacheRows, TrainImages, stream_loader


def synthetic_jpegs(root: Path, n: int, seed: int = 0) -> list[str]:
    """Smooth random scenes at VOC's common sizes (JPEG cost depends on size and content, not labels)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        w, h = (500, 375) if i % 3 else (375, 500)
        small = rng.integers(0, 256, size=(h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        noise = rng.integers(-12, 13, size=(h, w, 3))
        img = Image.fromarray(np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8))
        rel = f"JPEGImages/{i:06d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(root / rel, quality=90)
        paths.append(rel)
    return paths


def toy_images(root: Path, n: int) -> tuple[list[str], Path]:
    from noisymlt.data.toy import make_toy

    voc = make_toy(root / "raw", seed=0, n_trainval=n, n_test=8, image_size=64)
    return sorted(str(p.relative_to(voc)) for p in (voc / "JPEGImages").glob("*.jpg"))[:n], voc


def epoch_batches(n: int, batch: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    seeds = rng.integers(0, 2**63 - 1, size=n)
    items = [((int(i),), int(s), False) for i, s in zip(order, seeds)]
    return [items[b:b + batch] for b in range(0, n - batch + 1, batch)]


def time_loader(dataset, batches, workers: int, device: torch.device, size: int) -> float:
    loader = stream_loader(dataset, batches[:1], workers, pin_memory=device.type == "cuda")
    for _ in loader:  # warm-up: worker start, page cache
        pass
    loader.batch_sampler.batches = batches
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    count = 0
    for b in loader:
        images = b["images"].to(device, non_blocking=True)
        if "aug" in b:
            images = augment(images.flatten(0, 1), b["aug"].flatten(0, 1).to(device), size)
        count += images.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - t0)


def time_device_images(cache: Path, batches, device: torch.device, size: int) -> float:
    """img/s of ``noisymlt.training.device_images``: the cache's rows on ``device``, each batch indexed and
    augmented there (the set's upload, once per run, is not counted)."""
    from noisymlt.training.device_images import DeviceBatches, DeviceImages

    loader = DeviceBatches(DeviceImages(cache, device, size))
    loader.batch_sampler.batches = batches[:2]
    for _ in loader:  # warm-up: kernels, allocator
        pass
    loader.batch_sampler.batches = batches
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    count = sum(b["images"].shape[0] for b in loader)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - t0)


def scenario(name: str, n: int, workers: list[int], batch: int, device: torch.device, tmp: Path) -> dict:
    size, cache_size = (32, 40) if name == "toy" else (224, 256)
    if name == "toy":
        paths, root = toy_images(tmp / "toy", n)
    else:
        root = tmp / "voc"
        paths = synthetic_jpegs(root, n)
    labels = tmp / f"{name}.parquet"
    write_labels(LabelTable(image_ids=[Path(p).stem for p in paths], classes=["c"],
                            labels=np.ones((len(paths), 1), dtype=np.float32), paths=paths), labels)
    t0 = time.perf_counter()
    build_cache(labels, root, cache_size, tmp / f"{name}_cache.npy", progress=False)
    build_s = time.perf_counter() - t0
    batches = epoch_batches(len(paths), batch)
    rows = []
    for w in workers:
        pil = TrainImages(root, paths, size, photometric=True)
        cached = CachedTrainImages(CacheRows(tmp / f"{name}_cache.npy"), size, photometric=True)
        rows.append({"loader": "pil", "workers": w, "img_per_s": time_loader(pil, batches, w, torch.device("cpu"), size)})
        rows.append({"loader": "cache", "workers": w,
                     "img_per_s": time_loader(cached, batches, w, torch.device("cpu"), size)})
        deferred = CachedTrainImages(CacheRows(tmp / f"{name}_cache.npy"), size, photometric=True, deferred=True)
        rows.append({"loader": "cache_batched", "workers": w,
                     "img_per_s": time_loader(deferred, batches, w, torch.device("cpu"), size)})
        if device.type == "cuda":
            rows.append({"loader": "cache_batched_gpu", "workers": w,
                         "img_per_s": time_loader(deferred, batches, w, device, size)})
    # the training set on the device (train.device_images): no workers; at this batch and at Ours' balanced 256
    for b in sorted({batch, 256}):
        rows.append({"loader": f"device_images_b{b}", "workers": 0,
                     "img_per_s": time_device_images(tmp / f"{name}_cache.npy", epoch_batches(len(paths), b), device,
                                                     size)})
    for r in rows:
        print(f"{name:<5} {r['loader']:<18} workers={r['workers']:<3} {r['img_per_s']:>9.1f} img/s")
    print(f"{name:<5} cache build: {len(paths)} images in {build_s:.1f} s ({len(paths) / build_s:.1f} img/s)")
    return {"scenario": name, "images": len(paths), "image_size": size, "cache_size": cache_size,
            "batch_size": batch, "cache_build_s": build_s, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", nargs="+", choices=["toy", "voc"], default=["toy", "voc"])
    ap.add_argument("--images", type=int, default=300, help="images per scenario")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the main process")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (adds the on-device augmentation row)")
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        results = [scenario(s, args.images, args.workers, args.batch_size, device, Path(tmp)) for s in args.scenario]
    record = {"results": results, "torch_threads": args.threads, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
              "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "device": str(device),
              "platform": platform.platform(), "torch": torch.__version__}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
