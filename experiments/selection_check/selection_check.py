#!/usr/bin/env python
"""Does noisy validation pick well? For each model-selection candidate of a finished workflow, its validation mAP
(against the held-out noisy labels, what the selection ranked) beside the test mAP of the same model on the clean
test set, and the Spearman rank correlation of the two per stage: over the candidates' means across the
selection sets (what the selection ranked), and within each set (pooling the sets' raw scores would mix their
levels: a set whose held-out part scores higher is not the one whose models test higher).

This reads the test set, which is why it is a script for the note and never a pipeline step: selection itself
never does (noisymlt.pipeline.selection). It loads each candidate's final checkpoint and predicts the test images; nothing
is trained or written inside the project folder.

    python experiments/selection_check/selection_check.py --root . --dataset toy --method ours --json experiments/selection_check/result.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def spearman(a: list[float], b: list[float]) -> float | None:
    from scipy import stats

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return round(float(stats.spearmanr(a, b).statistic), 3)


def candidate_means(rows: list[dict]) -> list[dict]:
    """Each candidate's validation and test mAP, each the mean over the selection sets (in the stage's order)."""
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    return [{"tag": t, **{k: round(float(np.mean([r[k] for r in rows if r["tag"] == t])), 2)
                          for k in ("val_map", "test_map")}} for t in tags]


def per_set_spearman(rows: list[dict]) -> dict[str, float | None]:
    sets = list(dict.fromkeys(r["set"] for r in rows))
    return {s: spearman([r["val_map"] for r in rows if r["set"] == s], [r["test_map"] for r in rows if r["set"] == s])
            for s in sets}


def candidate_test_map(root: Path, run: Path, dataset: str) -> float:
    """Total mAP (%) on the test set of a candidate's trained model (its ranked head)."""
    from noisymlt.data.labels import read_labels
    from noisymlt.evaluation.metrics import average_precisions
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.trainer import Trainer

    cfg = json.loads((run / "run_config.json").read_text())
    inputs = json.loads((run / "manifest.json").read_text())["inputs"]
    params = {"datasets": {dataset: {"kind": cfg["kind"]}}}  # the image folders follow the dataset's kind
    caches = {}
    if "train_cache" in inputs:
        caches = {"train_cache": root / inputs["train_cache"]["path"], "test_cache": root / f"data/{dataset}/cache/test.npy"}
    test = root / f"data/{dataset}/test_labels.parquet"
    trainer = Trainer(cfg, train_labels=root / inputs["train_labels"]["path"], test_labels=test,
                      split=root / inputs["split"]["path"], train_images=root / image_root(params, dataset, "train"),
                      test_images=root / image_root(params, dataset, "test"), out_dir=run, device="cpu",
                      progress=False, **caches)
    trainer.load_checkpoint()
    heads = trainer.predict()
    head = "ensemble" if "ensemble" in heads else next(iter(heads))
    return 100 * float(np.nanmean(average_precisions(read_labels(test).labels, heads[head])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="the finished workflow's project folder")
    ap.add_argument("--dataset", default="toy")
    ap.add_argument("--method", default="ours")
    ap.add_argument("--json", help="file to write the table to")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    root = Path(args.root).resolve()
    json_out = Path(args.json).resolve() if args.json else None  # relative to where it was called, not to root
    import os

    os.chdir(root)  # recorded paths are relative to the project folder
    from noisymlt.pipeline import selection as S

    out = {"dataset": args.dataset, "method": args.method, "stages": []}
    k = 1
    while (root / S.stage_file(args.dataset, args.method, k)).is_file():
        record = json.loads((root / S.stage_file(args.dataset, args.method, k)).read_text())
        rows = []
        for cand in record["candidates"]:
            for key in cand["scores"]:
                gamma, seed = key[1:].split("_s")
                run = root / S.candidate_dir(args.dataset, args.method, k, float(gamma), int(seed), cand["tag"])
                rows.append({"tag": cand["tag"], "set": key, "val_map": cand["scores"][key],
                             "test_map": round(candidate_test_map(root, run, args.dataset), 2)})
                print(f"stage {k} {cand['tag']:>20} {key}: validation {rows[-1]['val_map']:.2f}  "
                      f"test {rows[-1]['test_map']:.2f}", flush=True)
        cands = candidate_means(rows)
        best_test = max(cands, key=lambda c: c["test_map"])
        out["stages"].append({
            "stage": k, "keys": record["keys"], "winner": record["winner"], "rows": rows, "candidates": cands,
            "spearman": spearman([c["val_map"] for c in cands], [c["test_map"] for c in cands]),
            "spearman_per_set": per_set_spearman(rows), "best_on_test": best_test["tag"],
            "test_map_of_winner": next(c["test_map"] for c in cands if c["tag"] == record["winner"])})
        print(f"stage {k}: Spearman rho {out['stages'][-1]['spearman']} over the candidates' means "
              f"(per set: {out['stages'][-1]['spearman_per_set']}); chosen {record['winner']}, best on test "
              f"{best_test['tag']}")
        k += 1
    every = [c for st in out["stages"] for c in st["candidates"]]
    out["spearman_all"] = spearman([c["val_map"] for c in every], [c["test_map"] for c in every])
    out["spearman_all_per_set"] = per_set_spearman([r for st in out["stages"] for r in st["rows"]])
    print(f"all candidates: Spearman rho {out['spearman_all']} (per set: {out['spearman_all_per_set']})")
    if json_out:
        json_out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
