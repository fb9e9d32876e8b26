#!/usr/bin/env python
"""Targeted experiment: do the layers that start from scratch (neck and head) learn too slowly on the toy?

On the toy the neck's BatchNorm centres the features, so every class's output can move away from 0.5 only
through its head bias; at lr 0.02, SGD momentum 0.9 and a loss averaged over 20 classes a bias moves by at most
~0.005 a step, far too little in 176 steps to reach the class-prior logits (about -3). This trains each method on
one noisy set of the demo (its configuration, its caches) with the layers that are not in the pretrained backbone
(neck, head, partner BatchNorms, BBN's classifier, ML-GCN's GCN) at 1x (as configured), and at the factors given,
the backbone always at the recipe's lr, and prints per variant the fit diagnostics (noisymlt.training.fit_diagnostics: the
training BCE against the prior-only BCE, the test outputs' spread, and for the co-learning family the targets the
pseudo labels changed in each branch with their precision) and the test mAP.

Needs the demo's data (`snakemake --profile workflow/profiles/demo data/toy/noisy/g0.5_s0.parquet
data/toy/train_labels.parquet data/toy/cache/train.npy data/toy/cache/test.npy data/pretrained/toy_glyphs.pt`).

    python experiments/new_layer_lr/experiment_new_layer_lr.py --methods erm bbn db_focal ours --json experiments/new_layer_lr/result.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="file to write every variant's diagnostics to")
    ap.add_argument("--methods", nargs="+", default=["erm", "bbn", "db_focal", "ours"])
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mults", type=float, nargs="+", default=[1.0, 10.0],
                    help="lr factors of the layers outside the pretrained backbone (train.new_layers_lr_mult)")
    ap.add_argument("--new-layers", nargs="+", metavar="NAME",
                    help="the name components that count as new layers (default: noisymlt.training.schedule.NEW_LAYERS)")
    ap.add_argument("--tag", default="", help="suffix of this run's variant names in the JSON")
    ap.add_argument("--train-seed", type=int,
                    help="the training's own seed (initialisation, sampling, views) when it differs from --seed, which "
                         "then names the noisy label set only")
    ap.add_argument("--clean-train", action="store_true",
                    help="train on the clean labels of the subset (the fit the toy allows; analysis only)")
    ap.add_argument("--values", nargs="*", default=[], metavar="KEY=VALUE",
                    help="selection values applied as a choice file would (noisymlt.pipeline.selection.apply_values), "
                         "e.g. alpha=0.9 beta=0.1")
    ap.add_argument("--method-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="method-block values (YAML, dotted keys merged into the block), e.g. "
                         "loss_params.max_margin=0.000001 or branches.balanced.dropout=0")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra train-block values for every variant, e.g. lr=0.08 (YAML values)")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    import yaml

    from noisymlt.data.labels import read_labels
    from noisymlt.evaluation.metrics import average_precisions
    from noisymlt.config import load_params, resolve_run
    from noisymlt.pipeline.paths import image_root
    from noisymlt.pipeline.selection import apply_values
    from noisymlt.training.trainer import Trainer

    import noisymlt.training.schedule

    if args.new_layers:
        noisymlt.training.schedule.NEW_LAYERS = frozenset(args.new_layers)
    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    params.setdefault("selection", {})["enabled"] = False  # the demo's fixed values: this is not a selection
    data = REPO / "data" / "toy"
    images = REPO / image_root(params, "toy", "train")
    test = read_labels(data / "test_labels.parquet")
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        for k, (method, mult) in enumerate((m, x) for m in args.methods for x in args.mults):
            cfg = resolve_run(params, "toy", method, args.gamma, args.seed)
            if args.train_seed is not None:
                cfg["seed"] = args.train_seed
            if args.values:
                values = {k: float(v) for k, v in (item.split("=", 1) for item in args.values)}
                cfg = apply_values(params, cfg, values, "--values")
            cfg["train"]["new_layers_lr_mult"] = mult
            for item in args.set:
                key, value = item.split("=", 1)
                cfg["train"][key] = yaml.safe_load(value)
            for item in args.method_set:
                key, value = item.split("=", 1)
                *path, last = key.split(".")
                block = cfg["method_cfg"]
                for part in path:
                    block = block.setdefault(part, {})
                block[last] = yaml.safe_load(value)
            labels = (data / "train_labels.parquet" if args.clean_train
                      else data / "noisy" / f"g{args.gamma:g}_s{args.seed}.parquet")
            trainer = Trainer(cfg, train_labels=labels,
                              test_labels=data / "test_labels.parquet", split=data / "class_split.json",
                              train_images=images, test_images=images, out_dir=Path(scratch) / str(k), device="cpu",
                              progress=False, train_cache=data / "cache" / "train.npy",
                              test_cache=data / "cache" / "test.npy", clean_labels=data / "train_labels.parquet")
            history = trainer.fit()
            scores = trainer.predict()
            train_scores = trainer.predict(part="train")
            # how often each head's outputs on the training images cross [CL]'s thresholds: a peer whose
            # outputs never do gives its partner no pseudo labels, whatever alpha and beta are
            crossing = {head: {f"{side}_{t:g}": round(float(((s > t) if side == "above" else (s < t)).mean()), 5)
                               for side, t in (("above", 0.7), ("above", 0.9), ("below", 0.1))}
                        for head, s in train_scores.items()}
            fit = trainer.fit_record(history, scores)
            maps = {head: round(100 * float(np.nanmean(average_precisions(test.labels, s))), 2)
                    for head, s in scores.items()}
            records = fit.get("pseudo_labels") or []
            last_epoch = max((r["epoch"] for r in records), default=None)
            pl = {r["branch"]: {"changed": r["changed"], "precision": r["precision"]}
                  for r in records if r["epoch"] == last_epoch}
            out.setdefault(method, {})[f"x{mult:g}{args.tag}"] = {
                "test_map": maps, "prior_bce": fit["prior_bce"], "heads": fit["heads"], "lr_peak": fit["lr_peak"],
                "pseudo_labels_last_epoch": pl, "train_outputs_crossing": crossing}
            first = next(iter(scores))
            h = fit["heads"][first]
            print(f"{method}, new layers x{mult:g}: train BCE {h['train_bce']:.3f} "
                  f"(prior-only {fit['prior_bce']:.3f}), train mAP {h['train_map'] * 100:.1f}, test outputs "
                  f"{h['test_score_p05']:.2f}-{h['test_score_p95']:.2f}, test mAP {maps}, pseudo labels {pl}, "
                  f"train outputs {crossing}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    record = {"methods": args.methods, "gamma": args.gamma, "seed": args.seed, "train_seed": args.train_seed,
              "set": args.set, "values": args.values,
              "method_set": args.method_set,
              "new_layers": sorted(noisymlt.training.schedule.NEW_LAYERS), "runs": out}
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
