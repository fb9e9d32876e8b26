#!/usr/bin/env python
"""Do two finished projects hold the same results? Every run's predictions and metrics, compared exactly.

For a change that must not change results (a move, a refactor), run the demo in two fresh clones, one of the
commit before and one after, on the same machine, and compare them:

    python scripts/compare_runs.py BEFORE AFTER --json compare.json

Each ``runs/**/predictions.npz`` is compared array by array (dtype, shape and bytes), and each run's
``checkpoint.pt`` entry by entry (weights, optimizer and method state, RNG state, history). The code digest a
run records (the predictions' ``code_digest``, the checkpoint's ``code``) names the code that trained the
weights, and any edit of that code changes it, and with it the checkpoint's content hash (the predictions'
``checkpoint_sha256``): these are reported apart, not counted as a difference of results. ``metrics.json`` and
``map.json`` are compared byte for byte. Exit status 1 when a run is missing on one side or any result differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# which code trained the weights, and the checkpoint content hash that covers it: not results
IDENTITY_KEYS = ("code_digest", "checkpoint_sha256")
CHECKPOINT_IDENTITY = ("code", "content_sha256")


def _equal(x, y) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(_equal(u, v) for u, v in zip(x, y))
    return x == y


def compare_checkpoints(a: Path, b: Path) -> list[str]:
    """The checkpoint entries that differ, the code identity aside."""
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return sorted(k for k in set(x) | set(y) if k not in CHECKPOINT_IDENTITY and not _equal(x.get(k), y.get(k)))


def compare_predictions(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(result arrays that differ, identity fields that differ) between two predictions files."""
    with np.load(a) as x, np.load(b) as y:
        keys = sorted(set(x.files) | set(y.files))
        differ = [k for k in keys if k not in x.files or k not in y.files or x[k].dtype != y[k].dtype
                  or x[k].shape != y[k].shape or x[k].tobytes() != y[k].tobytes()]
    return [k for k in differ if k not in IDENTITY_KEYS], [k for k in differ if k in IDENTITY_KEYS]


def compare(before: Path, after: Path) -> dict:
    out = {"before": str(before), "after": str(after), "runs": 0, "missing": [], "predictions_differ": {},
           "identity_differs": 0, "checkpoints": 0, "checkpoints_differ": {}, "metrics_files": 0,
           "metrics_differ": []}
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
        ckpt = rel.parent / "checkpoint.pt"
        if (before / ckpt).exists() and (after / ckpt).exists():
            out["checkpoints"] += 1
            entries = compare_checkpoints(before / ckpt, after / ckpt)
            if entries:
                out["checkpoints_differ"][str(ckpt)] = entries
        for name in ("metrics.json", "map.json"):
            a, b = before / rel.parent / name, after / rel.parent / name
            if a.exists() or b.exists():
                out["metrics_files"] += 1
                if not (a.exists() and b.exists() and a.read_bytes() == b.read_bytes()):
                    out["metrics_differ"].append(str(rel.parent / name))
    out["identical"] = not (out["missing"] or out["predictions_differ"] or out["checkpoints_differ"]
                            or out["metrics_differ"])
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
          f"{result['checkpoints']} checkpoints, {len(result['checkpoints_differ'])} differ, "
          f"{result['metrics_files']} metrics files, {len(result['metrics_differ'])} differ, "
          f"{len(result['missing'])} missing on one side", file=sys.stderr)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
