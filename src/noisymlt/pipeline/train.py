"""The `noisymlt train` command: one run's resolved configuration and files, handed to the Trainer.

It reads the resolved configuration the workflow's rule wrote (--run-config, noisymlt.config.requested_config),
checks it holds what the method's model selection chose, picks the run's card (noisymlt.training.cards) and hands
the configuration, the input files and the card to the Trainer (noisymlt.training.trainer).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from noisymlt.config import read_choice
from noisymlt.core.files import json_object_arg
from noisymlt.errors import NoisyMLTError
from noisymlt.training.cards import choose_device
from noisymlt.training.checkpoint import archive_run
from noisymlt.training.trainer import Trainer

log = logging.getLogger(__name__)


def _check_selection(resolved: dict, path: str) -> None:
    """A run config that names a selection must hold what that selection chose."""
    chosen, selected = read_choice(path), (resolved.get("selected") or {}).get("values", {})
    if not selected or any(chosen.get(k) != v for k, v in selected.items()):
        raise NoisyMLTError(f"--selection {path} chose {chosen}, the run config holds {selected or 'no selection'}")


def _cmd_train(args: argparse.Namespace) -> int:
    resolved = json_object_arg(args.run_config, "--run-config")
    out = Path(args.out)
    if args.restart and (out / "checkpoint.pt").exists():
        # the old run moves to previous/replaced-STAMP/ and the new log says so in its first line
        aside = archive_run(out, f"replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        (out / "train_log.jsonl").write_text(json.dumps({"event": "restart", "previous_run": str(aside)}) + "\n")
        log.warning("--restart: the previous run is kept in %s", aside)
    extra = {}
    for item in args.provenance or []:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise NoisyMLTError(f"--provenance {item!r}: expected NAME=FILE with an existing file")
        extra[name] = Path(path)
    if args.selection:
        _check_selection(resolved, args.selection)
        extra["selection"] = Path(args.selection)
    trainer = Trainer(resolved, train_labels=args.train_labels, test_labels=args.test_labels, split=args.split,
                      train_images=args.train_images, test_images=args.test_images, out_dir=out,
                      device=choose_device(args.device, args.runs_per_gpu), progress=not args.no_progress,
                      provenance_inputs=extra, keep_stale=args.keep_stale, clean_labels=args.clean_labels,
                      train_cache=args.train_cache, test_cache=args.test_cache, cores=args.cores,
                      expect_code=args.expect_code)
    log.info("run %s: %s on %s gamma=%s seed=%s, %d iterations/epoch on %s", trainer.run_id, resolved["method"],
             resolved["dataset"], resolved["gamma"], resolved["seed"], trainer.iters, trainer.device)
    trainer.run()
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "train", help="train one method on one noisy training set and predict the test set",
        description="Train one (dataset, noise rate, seed, method) run from its resolved configuration "
                    "(--run-config: the JSON the Snakemake workflow writes to the run folder's requested_config.json, "
                    "noisymlt.config.requested_config). Resumes from OUT/checkpoint.pt when present; refuses a "
                    "checkpoint of a different configuration.",
    )
    p.add_argument("--run-config", required=True, help="resolved run config: a JSON file, or the JSON text itself")
    io = p.add_argument_group("files")
    io.add_argument("--train-labels", required=True, help="noisy train labels (Parquet from `noisymlt noise`)")
    io.add_argument("--test-labels", required=True, help="clean test labels (Parquet from `noisymlt parse`)")
    io.add_argument("--split", required=True, help="head/medium/tail class split JSON")
    io.add_argument("--train-images", required=True, help="folder the train label paths are relative to")
    io.add_argument("--test-images", required=True, help="folder the test label paths are relative to")
    io.add_argument("--train-cache", type=Path, help="decoded-image cache of the train subset (train.loader: cache)")
    io.add_argument("--test-cache", type=Path, help="decoded-image cache of the test set (train.loader: cache)")
    io.add_argument("--out", required=True, help="run folder (checkpoint, predictions, manifest)")
    io.add_argument("--clean-labels",
                    help="clean long-tail subset table: logs the noise of the targets each branch trains on "
                         "(OUT/noise_level.jsonl); read for that log only, never by training")
    io.add_argument("--selection", help="the choice file of the method's model selection "
                    "(noisymlt.pipeline.selection): the run config must hold the values it chose; recorded in the "
                    "manifest")
    io.add_argument("--provenance", nargs="*", metavar="NAME=FILE",
                    help="further upstream files whose sha256 the manifest records (raw-data manifest, clean subset)")
    p.add_argument("--device", default="auto", help="auto (a slot on the least-loaded GPU this job sees, in "
                   "CUDA_VISIBLE_DEVICES or the machine's; else the CPU), cpu, cuda:N")
    p.add_argument("--runs-per-gpu", type=int, metavar="K",
                   help="training runs one card takes at once (a slot lock each; the workflow passes its profile's "
                        "runs_per_gpu resource); default: $NOISYMLT_RUNS_PER_GPU, else 1")
    p.add_argument("--cores", type=int, help="CPU cores given to this job (train.workers: auto takes loader workers "
                   "from them); default: SLURM_CPUS_PER_TASK, else the process's CPU affinity")
    p.add_argument("--restart", action="store_true", help="keep an existing checkpoint aside and start over")
    p.add_argument("--keep-stale", action="store_true",
                   help="a checkpoint of another configuration is kept as checkpoint.<its run id>.pt and training "
                        "starts afresh (the workflow's choice: it reruns a job when its configuration changed); "
                        "without it such a checkpoint stops the run")
    p.add_argument("--expect-code", metavar="DIGEST|FILE",
                   help="the run's code digest the workflow planned the job for (a digest, or its digest file from "
                        "`noisymlt code-deps --out`): the job stops before training when the source now gives "
                        "another, instead of recording a result under code the workflow did not plan")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)
