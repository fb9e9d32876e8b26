#!/usr/bin/env python
"""Do two finished projects hold the same results? Every run's predictions and metrics, compared exactly.

For a change that must not change results (a move, a refactor), run the demo in two fresh clones, one of the
commit before and one after, on the same machine, and compare them:

    python scripts/compare_runs.py BEFORE AFTER --json compare.json

Each ``runs/**/predictions.npz`` is compared array by array (dtype, shape and bytes): its ``code_digest`` names
the code that trained the weights, which any edit of that code changes, so it is reported apart and not
counted as a difference of results. ``metrics.json`` and ``map.json`` are compared byte for byte. Exit status 1
when a run is missing on one side or any result differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

IDENTITY_KEYS = ("code_digest",)  # which code trained the weights: not a result


def compare_predictions(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(result arrays that differ, identity fields that differ) between two predictions files."""
    with np.load(a) as x, np.load(b) as y:
        keys = sorted(set(x.files) | set(y.files))
        differ = [k for k in keys if k not in x.files or k not in y.files or x[k].dtype != y[k].dtype
                  or x[k].shape != y[k].shape or x[k].tobytes() != y[k].tobytes()]
    return [k for k in differ if k not in IDENTITY_KEYS], [k for k in differ if k in IDENTITY_KEYS]


def compare(before: Path, after: Path) -> dict:
    out = {"before": str(before), "after": str(after), "runs": 0, "missing": [], "predictions_differ": {},
           "identity_differs": 0, "metrics_files": 0, "metrics_differ": []}
    names = {p.relative_to(before) for p in (before / "runs").rglob("predictions.npz")}
    names |= {p.relative_to(after) for p in (after / "runs").rglob("predictions.npz")}
    for rel in sorted(names):
        if not (before / rel).exists() or not (after / rel).exists():
            out["missing"].append(str(rel))
            continue
        out["runs"] += 1
        results, identity = compare_predictions(before / rel, after / rel)
        if results:
            out["predictions_differ"][str(rel)] = results
        out["identity_differs"] += bool(identity)
        for name in ("metrics.json", "map.json"):
            a, b = before / rel.parent / name, after / rel.parent / name
            if a.exists() or b.exists():
                out["metrics_files"] += 1
                if not (a.exists() and b.exists() and a.read_bytes() == b.read_bytes()):
                    out["metrics_differ"].append(str(rel.parent / name))
    out["identical"] = not (out["missing"] or out["predictions_differ"] or out["metrics_differ"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path, help="a finished project (its runs/ folder is read)")
    ap.add_argument("after", type=Path, help="the other finished project")
    ap.add_argument("--json", type=Path, help="write the comparison here too")
    args = ap.parse_args()
    result = compare(args.before, args.after)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(f"{result['runs']} runs: predictions {'identical' if not result['predictions_differ'] else 'DIFFER'} "
          f"({len(result['predictions_differ'])} differ; code digest differs in {result['identity_differs']}), "
          f"{result['metrics_files']} metrics files, {len(result['metrics_differ'])} differ, "
          f"{len(result['missing'])} missing on one side", file=sys.stderr)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
