#!/usr/bin/env python
"""How long each noise model takes to draw one noisy set, beside the calibration workload of the same call.

    python scripts/benchmark_noise.py --json noise.json
    python scripts/benchmark_noise.py --rows 118000 --classes 80

The labels are a synthetic ``--rows`` x ``--classes`` matrix of falling class frequency (COCO 2017 train's size by
default, 1 to 80 labels an image); each model draws at gamma 0.5 (noisymlt.data.noise.inject_noise, the median of
three draws), class_conditional from a random row-stochastic matrix. A paper-scale grid draws 40 sets per model
(two datasets, four rates, five seeds), each over the long-tailed subset, not the whole pool timed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import calibrate  # noqa: E402

DRAWN = ("cooccurrence", "uniform", "class_conditional", "missing")  # the models that draw (authors reads a file)


def labels(rows: int, classes: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = (rng.random((rows, classes)) < np.geomspace(0.3, 0.002, classes)).astype(np.uint8)
    y[np.arange(rows), rng.integers(0, classes, rows)] = 1  # every image has a label
    return y


def time_model(model: str, y: np.ndarray, repeats: int = 3) -> float:
    from noisymlt.data.noise import inject_noise

    prepared = None
    if model == "class_conditional":
        m = np.random.default_rng(1).random((y.shape[1], y.shape[1]))
        prepared = m / m.sum(axis=1, keepdims=True)
    seconds = []
    for seed in range(repeats):
        start = time.perf_counter()
        inject_noise(y, 0.5, seed, model, prepared)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=118_000, help="images of the label matrix (default 118000)")
    ap.add_argument("--classes", type=int, default=80, help="classes (default 80)")
    ap.add_argument("--json", help="also write the readings here")
    args = ap.parse_args()
    y = labels(args.rows, args.classes)
    out = {"rows": args.rows, "classes": args.classes, "positives": int(y.sum()),
           "seconds": {m: round(time_model(m, y), 3) for m in DRAWN}, "calibration": calibrate()}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
