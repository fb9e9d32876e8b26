#!/usr/bin/env python
"""Targeted experiment: does Ours' test-time ensemble weight tau explain a baseline scoring above it?

Ours predicts z = tau * f + (1 - tau) * g from its random (f) and balanced (g) branch logits (paper Sec. 3.6,
tau 0.1). A finished workflow keeps both branches' sigmoid outputs in each run's predictions.npz, so the
ensemble at any tau can be recombined offline (logits recovered from the clipped outputs) without training.
Prints, per noise rate, Ours' mean test mAP over the seeds at each tau beside the other method's; the tau a
run used is one of the columns, so its value matches the run's own mAP. Reads the test labels: a script for
the note, never a pipeline step, and it never writes into the project.

    python experiments/ensemble_tau/experiment_ensemble_tau.py --root . --versus ldam --json tau.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CLIP = 1e-7


def logits(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, CLIP, 1 - CLIP)
    return np.log(p / (1 - p))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="the finished workflow's project folder")
    ap.add_argument("--dataset", default="toy")
    ap.add_argument("--versus", default="ldam", help="the method to set beside Ours")
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--seeds", type=int, nargs="+", help="default: every seed folder of the first noise rate")
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.1, 0.5, 0.9, 1.0])
    ap.add_argument("--json", help="file to write the table to")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    from noisymlt.data.labels import read_labels
    from noisymlt.evaluation.metrics import average_precisions

    root = Path(args.root).resolve()
    test = read_labels(root / "data" / args.dataset / "test_labels.parquet")

    def mean_ap(scores: np.ndarray) -> float:
        return 100 * float(np.nanmean(average_precisions(test.labels, scores)))

    first = root / "runs" / args.dataset / f"g{args.gammas[0]:g}"
    seeds = args.seeds or sorted(int(p.name[1:]) for p in first.glob("s*"))
    out = {"dataset": args.dataset, "versus": args.versus, "taus": args.taus, "seeds": seeds, "gammas": {}}
    for g in args.gammas:
        ours = {t: [] for t in args.taus}
        other = []
        for s in seeds:
            run = root / "runs" / args.dataset / f"g{g:g}" / f"s{s}"
            z = np.load(run / "ours" / "predictions.npz")
            f, b = logits(z["scores_random"]), logits(z["scores_balanced"])
            for t in args.taus:
                ours[t].append(mean_ap(1 / (1 + np.exp(-(t * f + (1 - t) * b)))))
            v = np.load(run / args.versus / "predictions.npz")
            other.append(mean_ap(v[f"scores_{str(v['heads'][0])}"]))
        row = {f"ours_tau{t:g}": round(float(np.mean(m)), 2) for t, m in ours.items()}
        row[args.versus] = round(float(np.mean(other)), 2)
        out["gammas"][f"{g:g}"] = row
        print(f"gamma {g:g}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
