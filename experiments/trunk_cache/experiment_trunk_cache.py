"""Targeted experiment: what do fixed views (train.trunk_cache_views) change against fresh ones, and what do
they save?

For each number of views V (0 = a fresh view per slot, the references') and each seed, trains ERM and Ours on
the demo's gamma 0.5 noisy set (the demo profile's configuration, its fixed alpha and beta, its new-layer factor)
with experiments/new_layer_lr/experiment_new_layer_lr.py and records the test mAP, the fit diagnostics and Ours' pseudo labels;
then times each method per V with scripts/benchmark_run.py (CPU seconds of the training phase, the cache
build included: each timed run computes it, --cold-memo; the median of --repeat runs). Writes one JSON
(experiments/trunk_cache/result.json), which the demo profile's choice of V cites. About 15 minutes on 2 cores; run it
on an idle machine (the timings are CPU seconds, but two processes sharing the cores slow each other).

    python experiments/trunk_cache/experiment_trunk_cache.py --json experiments/trunk_cache/result.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
METHODS = ("erm", "ours")


def variant(views: int, seed: int, scratch: Path) -> dict:
    out = scratch / f"v{views}_s{seed}.json"
    subprocess.run([sys.executable, str(REPO / "experiments" / "new_layer_lr" / "experiment_new_layer_lr.py"), "--methods", *METHODS,
                    "--seed", str(seed), "--mults", "10", "--set", f"trunk_cache_views={views}", "--tag", f"v{views}",
                    "--json", str(out)], check=True, cwd=REPO)
    runs = json.loads(out.read_text())["runs"]
    return {m: next(iter(runs[m].values())) for m in METHODS}


def cpu_seconds(method: str, views: int, scratch: Path, repeat: int) -> float:
    layer = scratch / f"views{views}.yaml"
    layer.write_text(f"selection: {{enabled: false}}\ntrain: {{trunk_cache_views: {views}}}\n")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark_run.py"), "--method", method,
                           "--repeat", str(repeat), "--params", "params.yaml", "workflow/profiles/demo/params.yaml",
                           str(layer), "--cold-memo"],  # the build included: no run finds an earlier run's memo
                          check=True, cwd=REPO, capture_output=True, text=True)
    return float(re.search(r"median of \d+ \(CPU seconds\): setup=[\d.]+ fit=([\d.]+)", proc.stdout).group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--views", type=int, nargs="+", default=[0, 8, 16, 32])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per method and V (the median is kept)")
    args = ap.parse_args()
    record: dict = {"gamma": 0.5, "methods": list(METHODS), "runs": {}, "fit_cpu_seconds": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for views in args.views:
            for seed in args.seeds:
                for method, run in variant(views, seed, Path(scratch)).items():
                    record["runs"].setdefault(method, {}).setdefault(f"v{views}", {})[f"s{seed}"] = run
            record["fit_cpu_seconds"][f"v{views}"] = {m: cpu_seconds(m, views, Path(scratch), args.repeat)
                                                      for m in METHODS}
            print(f"V {views}: {record['fit_cpu_seconds'][f'v{views}']} CPU s", flush=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
