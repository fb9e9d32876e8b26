"""How close may two selection candidates be before the selection cannot tell them apart? (issue 36)

The demo's model selection ranks Ours' candidates by their mean validation mAP over two noisy label sets. Two
spreads say how far such a score moves for reasons that are not the candidate's merit:

* between the selection sets: each candidate's score on set 0 minus set 1, around the mean of that difference
  over candidates (the candidate x set interaction): sd_e = sd(d) / sqrt(2) per set score, so the difference
  of two candidates' two-set means has sd sd_e;
* between CPU types: each candidate's two-set mean on this machine minus on another machine (its
  docs/demo_numbers.json), around the mean change; the difference of two candidates then moves with sd
  sqrt(2) * sd_c.

The margin is 1.96 times the larger of the two (a 95% two-sided bound on how far a pair's difference moves),
rounded up to 0.1 points. It is measured here, on the candidates' validation scores only (no test set, no
clean label), and is what the demo profile's selection.tie_margin is set to.

    python experiments/cpu_numerics/tie_margin.py --stage runs/toy/select/ours/stage2.json \\
        --other OTHER_demo_numbers.json --out experiments/cpu_numerics/tie_margin.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def candidates(stage_file: Path) -> dict[str, dict]:
    """Every stage's candidates of the last stage file: tag -> per-set scores and their mean."""
    rec = json.loads(stage_file.read_text())
    out = {}
    for st in [*rec.get("earlier_stages", []), rec]:
        for c in st["candidates"]:
            out[c["tag"]] = {"sets": c["scores"], "mean": c["mean"]}
    return out


def other_means(numbers: Path, method: str = "ours") -> dict[str, float]:
    row = next(r for r in json.loads(numbers.read_text())["selection"] if r["method"] == method)
    return {tag: v for st in row["stages"] for tag, v in st["scores"].items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", required=True, help="this machine's last stage file of Ours' selection")
    p.add_argument("--other", required=True, help="docs/demo_numbers.json made on another machine")
    p.add_argument("--other-numerics", default="", help="what the other machine was, in words")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    here = candidates(Path(args.stage))
    there = other_means(Path(args.other))
    made = next(Path(args.stage).with_suffix("").rglob("manifest.json"), None)  # a candidate run's manifest
    numerics = json.loads(made.read_text()).get("numerics") if made else None
    sets = sorted(next(iter(here.values()))["sets"])
    if len(sets) != 2:
        raise SystemExit(f"{args.stage}: expected candidates scored on two selection sets, got {sets}")
    d = np.array([c["sets"][sets[0]] - c["sets"][sets[1]] for c in here.values()])
    sd_sets = float(d.std(ddof=1) / math.sqrt(2))
    shared = sorted(set(here) & set(there))
    change = np.array([here[t]["mean"] - there[t] for t in shared])
    sd_cpu = float(change.std(ddof=1))
    pair_sd = {"between_sets": round(sd_sets, 3), "between_cpu_types": round(math.sqrt(2) * sd_cpu, 3)}
    margin = math.ceil(1.96 * max(pair_sd.values()) * 10 - 1e-9) / 10
    result = {
        "question": "how close may two selection candidates be before the selection cannot tell them apart?",
        "this_machine": {"stage_file": args.stage, "numerics": numerics, "sets": sets,
                         "candidates": {t: c for t, c in here.items()}},
        "other_machine": {"file": args.other, "numerics": args.other_numerics, "means": there},
        "mean_change_between_cpu_types": round(float(change.mean()), 3), "candidates_compared": len(shared),
        "pair_difference_sd": pair_sd,
        "tie_margin": margin,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("mean_change_between_cpu_types", "pair_difference_sd", "tie_margin")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
