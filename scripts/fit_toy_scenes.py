"""Fit the toy generator's scene model to a real label table: a mixture of independent Bernoulli labels.

The toy draws each image's labels from K latent "scenes" (a scene: a probability per class, labels
independent within it). Fit by EM to VOC2012 trainval's labels, the mixture carries VOC's class frequencies and
its co-occurrence (person in images of almost every class, indoor and street groups), and the [DB] long-tail
subsampling then turns a pool drawn from it into a subset with VOC-MLT's structure (tests/test_structure.py
holds the toy there). The fitted table is committed as src/noisymlt/data/toy_scenes.json; only these K x (C + 1)
numbers leave the label file.

    python scripts/fit_toy_scenes.py --labels data/voc/train_source_labels.parquet \
        --out src/noisymlt/data/toy_scenes.json

(the parsed VOC2012 trainval table of a `voc` dataset; a reference-style CSV with image_id and 0/1 class
columns works too). Deterministic: the same table and arguments give the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from noisymlt.data.labels import read_labels


def fit_bernoulli_mixture(y: np.ndarray, k: int, *, seed: int = 0, iterations: int = 300,
                          smoothing: float = 0.01) -> tuple[np.ndarray, np.ndarray, float]:
    """EM for p(y) = sum_s w_s prod_c theta_sc^y_c (1 - theta_sc)^(1 - y_c). Returns weights (K,),
    probabilities (K, C) and the final log-likelihood. ``smoothing`` is an additive prior on each theta."""
    y = np.asarray(y, dtype=np.float64)
    n, c = y.shape
    rng = np.random.default_rng(seed)
    weights = np.full(k, 1.0 / k)
    theta = rng.uniform(0.05, 0.3, size=(k, c))
    loglik = -np.inf
    for _ in range(iterations):
        log_p = np.log(weights)[None, :] + y @ np.log(theta).T + (1.0 - y) @ np.log1p(-theta).T
        top = log_p.max(axis=1, keepdims=True)
        resp = np.exp(log_p - top)
        loglik = float((np.log(resp.sum(axis=1)) + top[:, 0]).sum())
        resp /= resp.sum(axis=1, keepdims=True)
        mass = resp.sum(axis=0)
        weights = mass / n
        theta = np.clip((resp.T @ y + smoothing) / (mass[:, None] + 2 * smoothing), 1e-3, 1 - 1e-3)
    return weights, theta, loglik


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", required=True, help="label table (Parquet or reference-style CSV) to fit")
    ap.add_argument("--out", required=True, type=Path, help="scene table to write (JSON)")
    ap.add_argument("--scenes", type=int, default=20,
                    help="K (default 20: BIC still falls from 6 to 20 scenes on VOC2012 trainval)")
    ap.add_argument("--seed", type=int, default=0, help="EM initialisation seed (default 0)")
    ap.add_argument("--iterations", type=int, default=300, help="EM iterations (default 300)")
    args = ap.parse_args(argv)

    table = read_labels(args.labels)
    weights, theta, loglik = fit_bernoulli_mixture(table.labels, args.scenes, seed=args.seed,
                                                   iterations=args.iterations)
    order = np.argsort(-weights, kind="stable")  # largest scene first: a stable, readable file
    digest = hashlib.sha256(np.ascontiguousarray(table.labels, dtype=np.uint8).tobytes()).hexdigest()
    record = {
        "what": "Bernoulli mixture over the classes: scene s has weight w_s and label probability theta[s][c]",
        "fit": {"labels_sha256": digest, "images": int(table.labels.shape[0]), "scenes": args.scenes,
                "seed": args.seed, "iterations": args.iterations, "log_likelihood": round(loglik, 2),
                "script": "scripts/fit_toy_scenes.py"},
        "classes": list(table.classes),
        "weights": [round(float(w), 5) for w in weights[order]],
        "theta": [[round(float(t), 4) for t in row] for row in theta[order]],
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: {args.scenes} scenes over {len(table.classes)} classes fit to {table.labels.shape[0]} "
          f"images (log-likelihood {loglik:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
