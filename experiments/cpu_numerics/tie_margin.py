"""How close may two selection candidates be before the selection cannot tell them apart? (issue 36)

The demo's model selection ranks Ours' candidates by their mean validation mAP over two noisy label sets. Two
spreads say how far such a score moves for reasons that are not the candidate's merit:

* between the selection sets: each candidate's score on set 0 minus set 1, around the mean of that difference
  over candidates (the candidate x set interaction): sd_e = sd(d) / sqrt(2) per set score, so the difference
  of two candidates' two-set means has sd sd_e;
* between machines: each first-stage candidate's two-set mean on this machine minus on another machine (its
  docs/demo_numbers.json), around the mean change; the difference of two candidates then moves with sd
  sqrt(2) * sd_c. Later stages are left out: their candidates carry the earlier choices, which may differ.

The margin is 1.96 times the between-set sd (a 95% two-sided bound on how far a pair's difference moves for
reasons other than merit), rounded up to 0.1 points: a selection set's training run is another draw of training,
as another CPU type's is, so this is the selection's own resolution. The between-machine figure is reported
beside it; where the other machine also ran another precision it holds that change too. Both are measured on
the candidates' validation scores only (no test set, no clean label), and the margin is what the demo profile's
selection.tie_margin is set to.

    python experiments/cpu_numerics/tie_margin.py --select-dir runs/toy/select/ours \\
        [--other OTHER_demo_numbers.json] --out experiments/cpu_numerics/tie_margin.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def candidates(select_dir: Path) -> dict[str, dict]:
    """Every candidate scored on both selection sets under a method's selection folder (stage*/gG/sS/TAG/): tag ->
    per-set validation mAP (%) of the ranked head and their mean. Reads the candidates' own metrics, so a selection
    still running counts the candidates it has finished."""
    scores: dict[str, dict[str, float]] = {}
    for metrics in sorted(select_dir.glob("stage*/g*/s*/*/metrics.json")):
        tag, seed, gamma = metrics.parent.name, metrics.parent.parent.name, metrics.parent.parent.parent.name
        stage = metrics.parent.parent.parent.parent.name
        heads = json.loads(metrics.read_text())["heads"]
        head = "ensemble" if "ensemble" in heads else sorted(heads)[0]
        scores.setdefault((stage, tag), {})[f"{gamma}_{seed}"] = 100 * heads[head]["map"]["total"]
    sets = sorted({s for v in scores.values() for s in v})
    return {f"{stage}/{tag}": {"stage": stage, "tag": tag, "sets": v, "mean": float(np.mean(list(v.values())))}
            for (stage, tag), v in scores.items() if len(v) == len(sets)}


def other_means(numbers: Path, method: str = "ours") -> dict[str, float]:
    row = next(r for r in json.loads(numbers.read_text())["selection"] if r["method"] == method)
    return {tag: v for st in row["stages"] for tag, v in st["scores"].items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--select-dir", required=True, help="this machine's selection folder of Ours (runs/toy/select/ours)")
    p.add_argument("--other", help="docs/demo_numbers.json made on another machine from the same toy (optional: "
                                   "the margin itself needs this machine's two selection sets only)")
    p.add_argument("--other-numerics", default="", help="what the other machine was, in words")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    here = candidates(Path(args.select_dir))
    there = other_means(Path(args.other)) if args.other else {}
    made = next(Path(args.select_dir).rglob("manifest.json"), None)  # a candidate run's manifest
    numerics = json.loads(made.read_text()).get("numerics") if made else None
    sets = sorted(next(iter(here.values()))["sets"])
    if len(sets) != 2:
        raise SystemExit(f"{args.select_dir}: expected candidates scored on two selection sets, got {sets}")
    d = np.array([c["sets"][sets[0]] - c["sets"][sets[1]] for c in here.values()])
    sd_sets = float(d.std(ddof=1) / math.sqrt(2))
    # the first stage only: a later stage's candidates carry the earlier choices, which may differ between machines
    shared = sorted(k for k, c in here.items() if c["stage"] == "stage1" and c["tag"] in there)
    change = np.array([here[k]["mean"] - there[here[k]["tag"]] for k in shared])
    sd_cpu = float(change.std(ddof=1)) if len(shared) > 1 else None
    pair_sd = {"between_sets": round(sd_sets, 3),
               "between_machines": None if sd_cpu is None else round(math.sqrt(2) * sd_cpu, 3)}
    # the margin is the selection's own resolution (between its sets: a set's training run is another draw, as a
    # CPU type's is); the change between machines is reported beside it, since there it also holds the precision
    # the other machine ran (bf16 against fp32)
    margin = math.ceil(1.96 * pair_sd["between_sets"] * 10 - 1e-9) / 10
    result = {
        "question": "how close may two selection candidates be before the selection cannot tell them apart?",
        "this_machine": {"select_dir": args.select_dir, "numerics": numerics, "sets": sets,
                         "candidates": {t: c for t, c in here.items()}},
        "other_machine": {"file": args.other, "numerics": args.other_numerics, "means": there} if args.other else None,
        "mean_change_between_machines": round(float(change.mean()), 3) if len(shared) else None,
        "candidates_compared": len(shared),
        "pair_difference_sd": pair_sd,
        "tie_margin": margin,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("mean_change_between_machines", "pair_difference_sd", "tie_margin")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
