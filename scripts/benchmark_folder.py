#!/usr/bin/env python
"""A user's own folder set (kind folder): how long `noisymlt parse-folder` takes to check every row and image and
write one part, and how long its drawn test split takes, beside the calibration workload of the same call.

    python scripts/benchmark_folder.py --json folder.json
    python scripts/benchmark_folder.py --images 2000 --size 256 --split-rows 100000

The parse reads a CSV of ``--images`` rows over as many JPEGs of ``--size`` px (written first, not timed), resolves
each path inside the images folder, decodes each image in full with PIL (a truncated file is refused there), and
writes the train part; both parts read the whole table, so
a dataset's two parse jobs each take about this long. The split is noisymlt.data.splits.iterative_stratification on
a synthetic ``--split-rows`` x 80 label matrix of falling class frequency.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import calibrate  # noqa: E402


def write_set(root: Path, images: int, size: int, classes: int = 20, seed: int = 0) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    freq = np.geomspace(0.4, 0.01, classes)
    with open(root / "labels.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["image", *[f"c{j}" for j in range(classes)]])
        for i in range(images):
            y = (rng.random(classes) < freq).astype(int)
            y[rng.integers(classes)] = 1
            pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / f"{i:06d}.jpg", quality=90)
            rows.writerow([f"{i:06d}.jpg", *y])


def time_parse(root: Path) -> float:
    from noisymlt.cli import main

    start = time.perf_counter()
    rc = main(["parse-folder", "--labels", str(root / "labels.csv"), "--images", str(root / "images"), "--part",
               "train_source", "--out", str(root / "train.parquet")])
    assert rc == 0
    return time.perf_counter() - start


def time_split(rows: int, classes: int = 80) -> tuple[float, float]:
    from noisymlt.data.splits import iterative_stratification

    rng = np.random.default_rng(0)
    y = (rng.random((rows, classes)) < np.geomspace(0.5, 0.001, classes)).astype(np.uint8)
    start = time.perf_counter()
    held = iterative_stratification(y, 0.2, 0)
    seconds = time.perf_counter() - start
    return seconds, float(np.abs(y[held].sum(0) / np.maximum(y.sum(0), 1) - 0.2).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2000, help="rows and images of the set (default 2000)")
    ap.add_argument("--size", type=int, default=256, help="image side in px (default 256)")
    ap.add_argument("--split-rows", type=int, default=100_000, help="rows of the split's label matrix (default 100000)")
    ap.add_argument("--json", help="also write the readings here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_set(Path(tmp), args.images, args.size)
        parse_s = time_parse(Path(tmp))
    split_s, worst = time_split(args.split_rows)
    out = {"images": args.images, "size": args.size, "parse_s": round(parse_s, 2),
           "parse_images_per_s": round(args.images / parse_s), "split_rows": args.split_rows,
           "split_s": round(split_s, 2), "split_worst_class_share_error": round(worst, 4),
           "calibration": calibrate()}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
