#!/usr/bin/env python
"""Targeted experiment: where does the seed-to-seed spread of Ours - ERM at gamma 0.5 come from?

With five seeds the demo's paired 95% CI of Ours - ERM at gamma 0.5 stays near +-3 points: Ours' per-seed test mAP
spreads about three times as far as ERM's, most of it in its balanced branch. Two candidate causes, one run set each
(experiments/new_layer_lr/experiment_new_layer_lr.py trains a run of the demo's configuration in process):

* the demo's balanced batch of 64 ([CL]: 256, 8x the random batch): Ours with 256 on the demo's five seeds, paired
  with the demo's own ERM runs;
* the noisy label draw against the training's own randomness: Ours and ERM on one noisy label set (seed 0's) with
  five training seeds (initialisation, sampling, views), paired by training seed.

And what more noise draws give: Ours and ERM on five further noisy label sets (seeds 5-9 by default), trained by the
demo's own workflow (`snakemake --profile workflow/profiles/demo` with their metrics files as targets), paired with
the demo's five into ten draws.

Ours runs at the values the demo selected. Run it in a clone where `make demo` has finished:

    python experiments/ours_spread/run_ours_spread.py --json experiments/ours_spread/result.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "new_layer_lr"))
from demo_variants import SCRIPT, demo_map, ours_values, variant_map  # noqa: E402


def summary(values: list[float]) -> dict:
    """Per seed, mean, sd and the tables' 95% CI half-width (noisymlt.report.tables.mean_ci), rounded as printed."""
    from noisymlt.report.tables import mean_ci

    x = np.asarray(values, dtype=float)
    mean, half = mean_ci(x)
    return {"per_seed": [round(float(v), 2) for v in x], "mean": round(mean, 2),
            "sd": round(float(x.std(ddof=1)), 2), "ci95": round(half, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--label-seed", type=int, default=0, help="the noisy label set of the training-seed runs")
    ap.add_argument("--more-draws", type=int, nargs="*", default=[5, 6, 7, 8, 9],
                    help="further noisy label sets (seeds) on which the demo's workflow trains Ours and ERM")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    values = ["--values", *ours_values()]
    g = args.gamma
    todo = {("ours_bb256", s): ("ours", g, s, [*values, "--set", "balanced_batch_size=256"]) for s in args.seeds}
    todo |= {(f"{m}_train_seed", s): (m, g, args.label_seed, values if m == "ours" else [], s)
             for m in ("ours", "erm") for s in args.seeds}
    with ThreadPoolExecutor(args.jobs) as pool:
        maps = dict(zip(todo, pool.map(lambda job: variant_map(*job), todo.values())))
    if args.more_draws:  # the demo's own jobs: its noise rule, its train rule with the selected values
        targets = [f"runs/toy/g{g:g}/s{s}/{m}/metrics.json" for s in args.more_draws for m in ("ours", "erm")]
        subprocess.run([sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/demo", "--cores",
                        str(args.jobs), "--quiet", "--", *targets], cwd=REPO, check=True)
    demo = {m: [demo_map(m, g, s) for s in args.seeds] for m in ("ours", "erm")}
    draws = {m: demo[m] + [demo_map(m, g, s) for s in args.more_draws] for m in ("ours", "erm")}
    row = {name: [maps[name, s] for s in args.seeds] for name in ("ours_bb256", "ours_train_seed", "erm_train_seed")}
    record = {
        "question": "where does the seed spread of Ours - ERM at gamma 0.5 come from? Test mAP (%) per seed",
        "gamma": g, "seeds": args.seeds, "label_seed_of_train_seed_runs": args.label_seed, "ours_values": values[1:],
        "commands": {"ours_bb256": f"python {SCRIPT} --gamma {g:g} --seed S --mults 10 --methods ours "
                                   f"{' '.join(values)} --set balanced_batch_size=256",
                     "train_seed": f"python {SCRIPT} --gamma {g:g} --seed {args.label_seed} --train-seed S --mults 10 "
                                   f"--methods ours|erm [{' '.join(values)}]"},
        "demo (noisy labels and training seed vary together)": {
            "ours": summary(demo["ours"]), "erm": summary(demo["erm"]),
            "ours - erm": summary(np.subtract(demo["ours"], demo["erm"]))},
        "balanced batch 256 (demo seeds)": {
            "ours": summary(row["ours_bb256"]), "ours - erm": summary(np.subtract(row["ours_bb256"], demo["erm"]))},
        f"one noisy label set (seed {args.label_seed}), training seeds vary": {
            "ours": summary(row["ours_train_seed"]), "erm": summary(row["erm_train_seed"]),
            "ours - erm": summary(np.subtract(row["ours_train_seed"], row["erm_train_seed"]))},
    }
    if args.more_draws:
        record["commands"]["more_draws"] = (f"snakemake --profile workflow/profiles/demo -- runs/toy/g{g:g}/sS/ours/metrics.json "
                                            f"runs/toy/g{g:g}/sS/erm/metrics.json (S in {args.more_draws})")
        record[f"{len(args.seeds) + len(args.more_draws)} noise draws (seeds "
               f"{', '.join(map(str, args.seeds + args.more_draws))}), the demo's workflow"] = {
            "ours": summary(draws["ours"]), "erm": summary(draws["erm"]),
            "ours - erm": summary(np.subtract(draws["ours"], draws["erm"]))}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    for part, entries in record.items():
        if isinstance(entries, dict) and "ours" in entries:
            print(part)
            for name, s in entries.items():
                print(f"  {name:10s} mean {s['mean']:6.2f}  sd {s['sd']:5.2f}  ci95 {s['ci95']:5.2f}  {s['per_seed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
