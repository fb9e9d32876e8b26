#!/usr/bin/env python
"""CPU seconds of one demo training run, phase by phase, trained in-process as a training job runs it.

Trains one (method, gamma, seed) run of the demo configuration on its image caches with
``noisymlt.training.trainer.Trainer`` (the phases of ``Trainer.run``: set-up, training, test prediction, the fit
record's train-set prediction, outputs) and prints the process CPU time of each phase, the median over
``--repeat`` runs. The modules a job imports are imported first, as the demo's preloaded jobs find them
(workflow.preload). CPU time, not wall time, so that other jobs on a shared machine do not inflate it.
The frozen-trunk views' outputs are memoised on disk (noisymlt.training.trunkcache): a run finds them when an earlier
run of the same seed and recipe saved them, as most of the demo's jobs do; ``--cold-memo`` deletes the memo
folder before each run, so every run computes them (as the first job of each key does). Each run's line says
which it did. ``--keep DIR`` keeps the last run folder (its predictions.npz compares runs before and after a change
with np.array_equal); ``--profile FILE`` writes a cProfile of the training phase of the last run.

Needs the demo's data (`snakemake --profile workflow/profiles/demo data/toy/noisy/g0.5_s0.parquet
data/pretrained/toy_glyphs.pt data/toy/cache/train.npy data/toy/cache/test.npy`).

    python scripts/benchmark_run.py --method erm --repeat 3
    python scripts/benchmark_run.py --method ours --keep /tmp/ours --profile ours.prof
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("setup", "fit", "predict", "fit_record", "outputs")


def one_run(cfg: dict, params: dict, out: Path, profile: Path | None) -> dict[str, float]:
    from noisymlt.core.manifest import now
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.trainer import Trainer

    d = cfg["dataset"]
    images = REPO / image_root(params, d, "train")
    seconds = {}
    t = time.process_time()

    def lap(name: str) -> None:
        nonlocal t
        now_t = time.process_time()
        seconds[name] = now_t - t
        t = now_t

    started = now()
    trainer = Trainer(cfg, train_labels=REPO / L.fill(L.NOISY, dataset=d, gamma=cfg["gamma"], seed=cfg["seed"]),
                      test_labels=REPO / L.fill(L.TEST_LABELS, dataset=d),
                      split=REPO / L.fill(L.CLASS_SPLIT, dataset=d),
                      train_images=images, test_images=images, out_dir=out, device="cpu", progress=False,
                      train_cache=REPO / L.fill(L.CACHE, dataset=d, part="train"),
                      test_cache=REPO / L.fill(L.CACHE, dataset=d, part="test"),
                      clean_labels=REPO / L.fill(L.TRAIN_LABELS, dataset=d))  # the noise log, as the workflow's job
    lap("setup")
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        history = profiler.runcall(trainer.fit)
        profiler.dump_stats(profile)
    else:
        history = trainer.fit()
    lap("fit")
    scores = trainer.predict()
    lap("predict")
    fit = trainer.fit_record(history, scores)
    lap("fit_record")
    trainer._write_outputs(started, history, scores, fit)
    lap("outputs")
    seconds["iterations"] = trainer.iters * cfg["train"]["epochs"]
    seconds["memo"] = trainer.images.trunk_memo or "no trunk cache"
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="erm")
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dataset", default="toy")
    ap.add_argument("--params", nargs="+", default=["params.yaml", "workflow/profiles/demo/params.yaml"])
    ap.add_argument("--repeat", type=int, default=1, help="runs; the median of each phase is printed")
    ap.add_argument("--keep", type=Path, help="keep the last run's folder here (replaced if it exists)")
    ap.add_argument("--profile", type=Path, help="cProfile of the last run's training phase")
    ap.add_argument("--cold-memo", action="store_true",
                    help="delete the trunk-cache memo folder (data/DATASET/cache/trunk) before each run")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    import importlib

    from noisymlt.config import load_params, resolve_run
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline.preload import PRELOAD_MODULES

    for name in PRELOAD_MODULES:  # imported before the clock starts, as a preloaded job finds them
        importlib.import_module(name)

    params = load_params(*[REPO / p for p in args.params])
    runs = []
    for r in range(args.repeat):
        last = r == args.repeat - 1
        cfg = resolve_run(params, args.dataset, args.method, args.gamma, args.seed)
        if args.cold_memo:
            # the trainer's memo folder, beside the train cache (noisymlt.training.inputs)
            shutil.rmtree((REPO / L.fill(L.CACHE, dataset=args.dataset, part="train")).parent / "trunk",
                          ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="noisymlt-bench-") as scratch:
            out = Path(scratch) / "run"
            runs.append(one_run(cfg, params, out, args.profile if last else None))
            if last and args.keep:
                shutil.rmtree(args.keep, ignore_errors=True)
                shutil.copytree(out, args.keep)
        print(f"{args.method} run {r + 1}: " + " ".join(f"{k}={runs[-1][k]:.2f}" for k in PHASES)
              + f" total={sum(runs[-1][k] for k in PHASES):.2f} (trunk memo: {runs[-1]['memo']})", flush=True)
    med = {k: statistics.median(run[k] for run in runs) for k in PHASES}
    total = statistics.median(sum(run[k] for k in PHASES) for run in runs)
    iters = runs[-1]["iterations"]
    print(f"{args.method} g{args.gamma:g} s{args.seed}, median of {len(runs)} (CPU seconds): "
          + " ".join(f"{k}={med[k]:.2f}" for k in PHASES) + f" total={total:.2f}; "
          f"{1000 * med['fit'] / iters:.1f} ms per training iteration ({iters})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
