#!/usr/bin/env python
"""Where one short training run's seconds go: imports, set-up, the training loop, the predictions, the writes.

Runs `noisymlt train` in this process on a finished demo (`make demo`: its data, caches and pretrained weights)
for the run named by --dataset/--gamma/--seed/--method, into a scratch folder, under cProfile, and reports the
wall seconds of each phase (cumulative time of the trainer's own methods), with the calibration workload of
scripts/calibration.py timed in the same call:

    python experiments/run_profile/profile_run.py --repo CLONE --method erm     # CLONE: a clone after `make demo`
    python experiments/run_profile/profile_run.py --repo CLONE --method dividemix --json profile_dividemix.json

The imports are timed apart, first (what a job pays without the preload server). Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# trainer method -> phase name (cumulative seconds; the phases do not overlap but for predict, which
# fit_record calls for the training images)
PHASES = {
    "__init__": "set-up (labels, model, weights, method, loaders)",
    "open_trunk": "trunk cache (build or load)",
    "_fit": "training loop (all epochs, with checkpoints)",
    "save_checkpoint": "  of which checkpoint writes",
    "predict": "predictions (test set, and the training set for the fit diagnostics)",
    "fit_record": "fit diagnostics (with the training-set prediction)",
    "_write_outputs": "outputs (predictions.npz, manifest, noise log)",
}


def phase_seconds(stats: pstats.Stats) -> dict[str, float]:
    out: dict[str, float] = {}
    for (filename, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        if filename.endswith("training/trainer.py") and name in PHASES:
            out[PHASES[name]] = round(out.get(PHASES[name], 0.0) + cumulative, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a clone where `make demo` has finished")
    ap.add_argument("--dataset", default="toy")
    ap.add_argument("--gamma", default="0.5")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--method", default="erm")
    ap.add_argument("--params", nargs="+", default=["params.yaml", "workflow/profiles/demo/params.yaml"],
                    help="the params layers the demo ran with (default: the demo's)")
    ap.add_argument("--json", help="file to write the phases to")
    ap.add_argument("--top", type=int, default=0, help="also print the N functions with the most own time")
    ap.add_argument("--sort", default="tottime", help="order of the --top list: tottime (own time) or cumulative")
    args = ap.parse_args()
    start = time.perf_counter()  # first: the calibration imports torch too
    import torchvision  # noqa: F401

    import noisymlt.cli as cli
    import noisymlt.training.trainer  # noqa: F401  (what the preload server imports once)
    from noisymlt.config import load_params
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline.paths import image_root

    imports = round(time.perf_counter() - start, 2)
    sys.path.insert(0, str(REPO / "scripts"))
    from calibration import calibrate

    calibration = calibrate()
    root = Path(args.repo).resolve()
    run = root / L.fill(L.RUN, dataset=args.dataset, gamma=args.gamma, seed=args.seed, method=args.method)
    os.chdir(root)
    params = load_params(*args.params)
    d = args.dataset
    out = Path(tempfile.mkdtemp(prefix="noisymlt-profile-")) / args.method
    argv = ["train", "--run-config", str(run / "run_config.json"),
            "--train-labels", L.fill(L.NOISY, dataset=d, gamma=args.gamma, seed=args.seed),
            "--test-labels", L.fill(L.TEST_LABELS, dataset=d), "--split", L.fill(L.CLASS_SPLIT, dataset=d),
            "--train-cache", L.fill(L.CACHE, dataset=d, part="train"),
            "--test-cache", L.fill(L.CACHE, dataset=d, part="test"),
            "--train-images", image_root(params, args.dataset, "train"),
            "--test-images", image_root(params, args.dataset, "test"), "--out", str(out), "--no-progress"]
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    code = cli.main(argv)
    profile.disable()
    total = round(time.perf_counter() - start, 2)
    if code:
        raise SystemExit(f"noisymlt train exited {code}, its outputs kept in {out}")
    shutil.rmtree(out.parent)  # the profiled run's checkpoint and predictions are not the point
    result = {"run": str(run.relative_to(root)), "imports_s": imports, "command_s": total,
              "phases_s": phase_seconds(pstats.Stats(profile)), "calibration": calibration,
              "note": "phase seconds are under cProfile, which slows Python-heavy code: compare their shares"}
    print(json.dumps(result, indent=1))
    if args.top:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
