#!/usr/bin/env python
"""Peak memory of one demo training run per method, to size how many run at once (docs/demo.md).

Each method's first run of a finished demo (`make demo`: runs/toy/g0.5/s0/METHOD/requested_config.json and the
data it read) is trained again, from nothing and into a temporary folder, by `noisymlt train` as a plain process
on one core with the demo's caches, as the train rule runs it. Its process tree is sampled every 0.05 s: the peak
resident set (RSS: what the process holds, its imports included) and proportional set (PSS: pages it shares with
others counted in part). A demo job runs in a child forked from the preload server, which shares the imports with
it, so a job's real share is nearer the PSS; the RSS is the bound `make demo` sizes by.

    python scripts/benchmark_demo_memory.py --project . --json docs/benchmarks/demo_memory.json   # ~5 min, 2 cores
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from calibration import calibrate  # noqa: E402


def _tree_mib(proc) -> tuple[float, float]:
    """(RSS, PSS) in MiB of a psutil process and its children, summed; processes that ended meanwhile left out."""
    import psutil

    rss = pss = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
    return rss / 2 ** 20, pss / 2 ** 20


def measure(project: Path, method: str, out: Path) -> dict:
    import psutil

    from noisymlt.config import load_params
    from noisymlt.pipeline import paths

    from noisymlt.pipeline import layout as L

    config = project / paths.run_dir("toy", 0.5, 0, method) / "requested_config.json"
    if not config.is_file():
        raise SystemExit(f"{config}: not found: run the demo first (make demo)")
    params = load_params(project / "params.yaml", project / "workflow/profiles/demo/params.yaml")
    loader = json.loads(config.read_text())["train"].get("loader", "pil")
    argv = [sys.executable, "-m", "noisymlt", "train", "--run-config", str(config),
            "--train-labels", L.fill(L.NOISY, dataset="toy", gamma=0.5, noise=paths.PAPER, seed=0),
            "--test-labels", L.fill(L.TEST_LABELS, dataset="toy"), "--split", L.fill(L.CLASS_SPLIT, dataset="toy"),
            "--train-images", paths.image_root(params, "toy", "train"),
            "--test-images", paths.image_root(params, "toy", "test"), *paths.cache_args("toy", loader),
            "--out", str(out), "--no-progress", "--device", "cpu", "--cores", "1"]
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc, peak_rss, peak_pss = psutil.Process(child.pid), 0.0, 0.0
    while child.poll() is None:
        rss, pss = _tree_mib(proc)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.05)
    if child.returncode != 0:
        raise SystemExit(f"{method}: noisymlt train exited {child.returncode}:\n{child.stderr.read()[-2000:]}")
    return {"peak_rss_mib": round(peak_rss), "peak_pss_mib": round(peak_pss),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=REPO, help="a project with a finished demo (default: here)")
    parser.add_argument("--methods", nargs="+", help="these methods only (default: every method of the demo grid)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    from noisymlt.config import load_params

    project = args.project.resolve()
    demo = load_params(project / "params.yaml", project / "workflow/profiles/demo/params.yaml")
    # a clean-then-retrain method trains its `of` method's recipe on a table of the same size: that method's peak
    methods = args.methods or [m for m in demo["grid"]["methods"] if not demo["methods"][m].get("clean")]
    before = calibrate()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            rows[method] = measure(project, method, Path(tmp) / method)
            print(f"{method:12s} {rows[method]}", flush=True)
    record = {"what": "peak memory of one demo training run (toy, gamma 0.5, seed 0) as a plain process, one core",
              "calibration": {"before": before, "after": calibrate()},
              "largest_peak_rss_mib": max(r["peak_rss_mib"] for r in rows.values()),
              "largest_peak_pss_mib": max(r["peak_pss_mib"] for r in rows.values()), "methods": rows}
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
