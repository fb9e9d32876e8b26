#!/usr/bin/env python
"""Targeted experiment: does fine-tuning on the toy improve on a linear probe of the pretrained trunk?

ImageNet features on VOC: fine-tuning adds several points over a linear classifier on the frozen features. The
pretrained toy trunk plays ImageNet's role only if that holds here. For each seed this trains a method on the
subset's CLEAN labels (the demo's configuration and caches, layered as given) and scores the test set, and fits
the ridge probe (noisymlt.training.probe) on the same frozen trunk's pooled features of the same clean training
images. Clean labels and the test set: analysis only, no setting is chosen from the fine-tuned test mAP here;
what it decides is whether the source task gives a trunk worth fine-tuning.

Needs the layered demo's data (`snakemake --profile workflow/profiles/demo --configfile ... data/toy/train_labels.parquet
data/toy/test_labels.parquet data/toy/cache/train.npy data/toy/cache/test.npy data/pretrained/toy_glyphs.pt`).

    python experiments/probe_vs_finetune/experiment_probe.py --root . \
        --seeds 0 1 2 --json experiments/probe_vs_finetune/result.json --tag demo_recipe

(the variants of result.json: experiments/probe_vs_finetune/run_variants.sh)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO, help="project folder holding data/ (default: this checkout)")
    ap.add_argument("--layers", nargs="*", default=[], help="params layers over params.yaml and the demo profile")
    ap.add_argument("--method", default="erm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--weights", help="backbone weights file (default: the profile's train.weights_path)")
    ap.add_argument("--pretrain-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="pretrain the profile's source task again with these values (YAML), e.g. photometric=false, "
                         "and fine-tune from those weights (kept in the scratch folder)")
    ap.add_argument("--tag", required=True, help="this variant's name in the JSON (the file gathers variants)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="train-block values (YAML)")
    ap.add_argument("--no-finetune", action="store_true", help="the probe only")
    ap.add_argument("--drop-photometric-ops", nargs="*", default=[], choices=("swap", "hue_saturation"),
                    help="train with the photometric distortion minus these ops (channel swap; the HSV hue shift and "
                         "saturation scaling): which of its ops does the harm. The run's trunk-cache memos then go to "
                         "the scratch folder, as the memo key cannot see this in-process change")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    import torch
    import yaml

    from noisymlt.config import load_params, resolve_run
    from noisymlt.data.labels import read_labels
    from noisymlt.evaluation.metrics import average_precisions
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.probe import pooled_features, ridge_probe
    from noisymlt.training.trainer import Trainer

    root = args.root.resolve()
    if args.drop_photometric_ops:
        _drop_photometric_ops(args.drop_photometric_ops)
    params = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml",
                         *[Path(p).resolve() for p in args.layers])
    params.setdefault("selection", {})["enabled"] = False
    data = root / "data" / "toy"
    test = read_labels(data / "test_labels.parquet")
    out = {"layers": args.layers, "method": args.method, "set": args.set, "pretrain_set": args.pretrain_set, "runs": {}}
    with tempfile.TemporaryDirectory() as scratch:
        weights = args.weights
        if args.pretrain_set:
            from noisymlt.training.pretrain import pretrain

            block = dict(params["pretrain"]["toy_glyphs"])
            for item in args.pretrain_set:
                key, value = item.split("=", 1)
                block[key] = yaml.safe_load(value)
            weights = Path(scratch) / "weights.pt"
            report = pretrain(block, weights, progress=False)
            out["pretrain_held_out_accuracy"] = report["held_out_accuracy"]
        torch.set_num_threads(1)
        for seed in args.seeds:
            cfg = resolve_run(params, "toy", args.method, 0.5, seed)
            for item in args.set:
                key, value = item.split("=", 1)
                cfg["train"][key] = yaml.safe_load(value)
            cfg["train"]["weights_path"] = str(root / (weights or cfg["train"]["weights_path"]))
            train_cache = data / "cache/train.npy"
            if args.drop_photometric_ops:
                import shutil

                train_cache = Path(scratch) / f"cache{seed}" / "train.npy"
                train_cache.parent.mkdir()
                for name in ("train.npy", "train.json", "train.manifest.json"):
                    shutil.copy(data / "cache" / name, train_cache.parent / name)
            trainer = Trainer(cfg, train_labels=data / "train_labels.parquet", test_labels=data / "test_labels.parquet",
                              split=data / "class_split.json", train_images=root / image_root(params, "toy", "train"),
                              test_images=root / image_root(params, "toy", "test"), out_dir=Path(scratch) / str(seed),
                              device="cpu", progress=False, train_cache=train_cache,
                              test_cache=data / "cache/test.npy", clean_labels=data / "train_labels.parquet")
            backbone = trainer.model.backbone if hasattr(trainer.model, "backbone") else trainer.model.branches[0].backbone
            t0 = time.perf_counter()
            train_x = pooled_features(backbone, (images for _, images in trainer.iterate_train_eval()))
            test_x = pooled_features(backbone, _test_batches(trainer))
            train_y = read_labels(data / "train_labels.parquet").labels
            probe = ridge_probe(train_x, train_y, test_x, seed=seed)
            probe_map = 100 * float(np.nanmean(average_precisions(test.labels, probe["test_scores"])))
            spectrum = np.linalg.eigvalsh(np.cov(train_x, rowvar=False))[::-1]
            record = {"probe_map": round(probe_map, 2), "probe_strength": probe["strength"],
                      "probe_cv_map": probe["cv_map"], "probe_seconds": round(time.perf_counter() - t0, 1),
                      "feature_participation_ratio": round(float(spectrum.sum() ** 2 / (spectrum ** 2).sum()), 2),
                      "feature_dim": int(train_x.shape[1])}
            if not args.no_finetune:
                t0 = time.perf_counter()
                trainer.fit()
                scores = trainer.predict()
                record["finetuned_map"] = {h: round(100 * float(np.nanmean(average_precisions(test.labels, s))), 2)
                                           for h, s in scores.items()}
                record["finetune_seconds"] = round(time.perf_counter() - t0, 1)
            out["runs"][str(seed)] = record
            print(seed, json.dumps(record), flush=True)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    gathered = json.loads(path.read_text()) if path.exists() else {}
    gathered[args.tag] = out
    path.write_text(json.dumps(gathered, indent=1) + "\n")
    return 0


def _drop_photometric_ops(ops: list[str]) -> None:
    import dataclasses

    from noisymlt.training import augment, transforms

    draw = transforms.draw_photometric

    def without(rng):
        p = draw(rng)  # the same draws in the same order: only the chosen ops are neutralised
        if "swap" in ops:
            p = dataclasses.replace(p, channels=(0, 1, 2))
        if "hue_saturation" in ops:
            p = dataclasses.replace(p, hue=0.0, saturation=1.0)
        return p

    augment.draw_photometric = without


def _test_batches(trainer):
    from noisymlt.training.loaders import eval_loader

    loader = eval_loader(trainer.images.eval_dataset("test"), trainer.cfg["train"]["eval_batch_size"], 0, False)
    for images in loader:
        yield trainer.images.eval_images(images)


if __name__ == "__main__":
    raise SystemExit(main())
