#!/usr/bin/env python
"""What would the demo cost under another regime? Each grid method trained once (gamma 0.5, seed 0) in this process
under each regime, one thread, and the demo's training runs priced at their method's seconds.

A regime: a data root (a project folder whose data/ holds that regime's toy: labels, caches, noisy set, weights),
the params layers over params.yaml and the demo profile, and train-block overrides for the uniform recipes and for
the class-aware (db) recipe. Both regimes are timed in one call, so the ratio of their totals does not depend on the
machine's speed. Ablation variants and selection candidates are priced at Ours' seconds (their family's), the
candidates at 80% of it (they train on 80% of the images).

    python experiments/demo_cost/estimate_cost.py --json experiments/demo_cost/result.json \
        --today GLYPH_ROOT --candidate VOC_ROOT --candidate-weights WEIGHTS.pt
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYER = "workflow/profiles/demo/voc_structure.yaml"
# the candidate regime of experiments/probe_vs_finetune: no photometric distortion, uniform recipes at 24 epochs,
# every recipe's new layers at 10x (the db recipe's 1x was a per-family exception)
UNIFORM = {"photometric": False, "epochs": 24, "lr_steps": [15, 21]}
CLASS_AWARE = {"photometric": False, "new_layers_lr_mult": 10}


def time_method(params: dict, root: Path, method: str, overrides: dict, weights: str | None, scratch: Path) -> float:
    import torch

    from noisymlt.config import resolve_run
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.trainer import Trainer

    cfg = resolve_run(params, "toy", method, 0.5, 0)
    cfg["train"].update(overrides)
    cfg["train"]["weights_path"] = str(root / (weights or cfg["train"]["weights_path"]))
    data = root / "data" / "toy"
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, train_labels=data / "noisy/g0.5_s0.parquet", test_labels=data / "test_labels.parquet",
                      split=data / "class_split.json", train_images=root / image_root(params, "toy", "train"),
                      test_images=root / image_root(params, "toy", "test"), out_dir=scratch / method, device="cpu",
                      progress=False, train_cache=data / "cache/train.npy", test_cache=data / "cache/test.npy",
                      clean_labels=data / "train_labels.parquet")
    history = trainer.fit()
    scores = trainer.predict()
    trainer.fit_record(history, scores)  # the fit diagnostics predict the training images too, as a run does
    return time.perf_counter() - t0


def regime_cost(params: dict, root: Path, weights: str | None, candidate: bool) -> dict:
    from noisymlt.config import resolve_run
    from noisymlt.pipeline.paths import all_runs

    seconds = {}
    with tempfile.TemporaryDirectory() as scratch:
        for method in params["grid"]["methods"]:
            cfg = resolve_run(params, "toy", method, 0.5, 0)
            # the db recipe's single-branch methods train class-aware ([DB]); DivideMix keeps its own schedule
            aware = params["methods"][method].get("schedule") == "db" and cfg["method_cfg"]["family"] == "single"
            overrides = (CLASS_AWARE if aware else UNIFORM) if candidate else {}
            if candidate and method == "dividemix":
                overrides = {"photometric": False}
            seconds[method] = round(time_method(params, root, method, overrides, weights, Path(scratch)), 2)
            print(("candidate" if candidate else "today"), method, seconds[method], flush=True)
    runs = all_runs(params)
    family = {m: m if m in seconds else "ours" for _, _, _, m in runs}
    total = sum(seconds[family[m]] for _, _, _, m in runs)
    candidates = 2 * (4 + 16)  # Ours' selection: 4 lr + 16 alpha x beta candidates on each of 2 sets
    total += candidates * 0.8 * seconds["ours"]
    return {"seconds_per_method": seconds, "runs": len(runs), "selection_candidates": candidates,
            "train_seconds": round(total, 1)}


def table(result: dict) -> str:
    """README.md's table from result.json."""
    today, cand = result["today"], result["candidate"]
    lines = ["| method | today (s) | candidate (s) | ratio |", "|---|---|---|---|"]
    for m, a in today["seconds_per_method"].items():
        b = cand["seconds_per_method"][m]
        lines.append(f"| {m} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    lines.append(f"| **training of the whole demo** ({today['runs']} runs + {today['selection_candidates']} candidates) "
                 f"| {today['train_seconds']:.0f} | {cand['train_seconds']:.0f} | {result['ratio']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--today", type=Path, required=True, help="project folder with the demo's (glyph) toy data")
    ap.add_argument("--candidate", type=Path, required=True, help="project folder with the voc-structure toy data")
    ap.add_argument("--candidate-weights", help="weights of a source task pretrained without photometric ops")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    from noisymlt.config import load_params

    base = [REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml"]
    today = load_params(*base)
    cand = load_params(*base, REPO / LAYER)
    for p in (today, cand):
        p.setdefault("selection", {})["enabled"] = False
    out = {"today": regime_cost(today, args.today.resolve(), None, False),
           "candidate": {**regime_cost(cand, args.candidate.resolve(), args.candidate_weights, True),
                         "uniform": UNIFORM, "class_aware": CLASS_AWARE}}
    out["ratio"] = round(out["candidate"]["train_seconds"] / out["today"]["train_seconds"], 2)
    print(f"train seconds: today {out['today']['train_seconds']}, candidate {out['candidate']['train_seconds']} "
          f"({out['ratio']}x)")
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
