"""Cross-fitting: out-of-sample probabilities of every training image, from models that never saw its label.

cleanlab asks for out-of-sample probabilities (its docs; its own multi-label benchmark uses 5-fold
cross-validation): a run's probabilities of its own training images are in-sample, and a label the model fitted
looks right. Cross-fitting splits a noisy training set into K folds and trains a base method K times, each run on
K - 1 folds, its "test" set the held-out fold; each image's probability then comes from the run that held it out.

- ``noisymlt crossfit split``: one fold per image for a dataset, by iterative stratification
  (noisymlt.data.splits.iterative_folds, the project's one multi-label stratifier) over the noisy labels of every
  set of the grid at once (each (set, class) a label to balance), so that every set's folds hold the same images
  and their image caches serve every set. Noisy labels only: the clean ones are never read.
- ``noisymlt crossfit parts``: one set's noisy table cut, for each fold, into the K - 1 folds its run trains on
  and the fold it predicts. Each fold's run is an ordinary training run (its code identity, manifest, checkpoint, SLURM job).
- ``noisymlt crossfit gather``: the K runs' predictions put together, one probability per (training image, class),
  after checking that every image was predicted once, by the run of its fold, whose training rows exclude it.
  Written as an .npz: ``image_ids``, ``classes``, ``probs`` (N, C) float32, ``fold`` (N,), ``runs`` and
  ``run_ids`` (fold order).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json, write_json
from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


def write_folds(tables: dict[str, Path], out: Path, folds: int, seed: int) -> dict:
    """folds.json: every image's fold, stratified on the noisy labels of all ``tables`` (noisy copies of one set)."""
    from noisymlt.data.parts import read_noisy_copies
    from noisymlt.data.splits import iterative_folds

    if folds < 2:
        raise NoisyMLTError(f"--folds {folds}: cross-fitting needs at least 2 folds")
    read = read_noisy_copies(tables)
    first_name, first = next(iter(read.items()))
    if len(first.image_ids) < folds:
        raise NoisyMLTError(f"{tables[first_name]}: {len(first.image_ids)} images cannot fill {folds} folds")
    labels = np.hstack([np.asarray(t.labels) > 0.5 for t in read.values()])
    fold = iterative_folds(labels, [1.0 / folds] * folds, seed)
    record = {
        "folds": folds, "seed": seed, "images": np.bincount(fold, minlength=folds).astype(int).tolist(),
        "image_ids": [str(i) for i in first.image_ids], "fold": fold.astype(int).tolist(),
        "positives": {name: [np.asarray(t.labels)[fold == k].sum(0).astype(int).tolist() for k in range(folds)]
                      for name, t in read.items()},
        "classes": list(first.classes), "stratified_on": {name: str(path) for name, path in tables.items()},
    }
    write_json(out, record)
    return record


def read_folds(path: str | Path) -> dict:
    record = read_json(path, "the cross-fitting folds", require_object=True)
    fold, ids = record.get("fold"), record.get("image_ids")
    if not isinstance(fold, list) or not isinstance(ids, list) or len(fold) != len(ids) or not record.get("folds"):
        raise NoisyMLTError(f"{path}: not a folds file of `noisymlt crossfit split` (image_ids, fold, folds)")
    return record


def write_parts(noisy: Path, folds: Path, train_out: list[Path], held_out: list[Path]) -> list[tuple[int, int]]:
    """Each fold's tables, in fold order: the one its run trains on (every other fold) and the one it predicts (the
    fold), noisy labels both."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.parts import write_cut

    record = read_folds(folds)
    if not len(train_out) == len(held_out) == record["folds"]:
        raise NoisyMLTError(f"{len(train_out)} --train and {len(held_out)} --held tables for the {record['folds']} "
                            f"folds of {folds}: one of each a fold, in fold order")
    table = read_labels(noisy, noisy_only=True)
    if [str(i) for i in table.image_ids] != record["image_ids"]:
        raise NoisyMLTError(f"{noisy}: its images are not those {folds} was split from")
    fold_of = np.asarray(record["fold"])
    return [write_cut(table, fold_of == k, held, train) for k, (train, held) in enumerate(zip(train_out, held_out))]


def _run_tables(run: Path) -> tuple[list[str], list[str]]:
    """(training image ids, predicted image ids) of a finished run, from the tables its manifest names, each
    checked against the content hash the manifest recorded."""
    from noisymlt.core.manifest import file_sha256
    from noisymlt.data.labels import read_labels

    manifest = read_json(run / "manifest.json", "the run's manifest", require_object=True)
    inputs = manifest.get("inputs") or {}
    ids = []
    for key in ("train_labels", "test_labels"):
        entry = inputs.get(key)
        if not isinstance(entry, dict) or not entry.get("path"):
            raise NoisyMLTError(f"{run}/manifest.json: no recorded input {key!r}; not a finished training run")
        path = Path(entry["path"])
        if not path.is_file() or file_sha256(path) != entry.get("sha256"):
            raise NoisyMLTError(f"{path}: not the {key.replace('_', ' ')} run {run} trained with (missing or changed "
                                "since); rerun the fold's run")
        ids.append([str(i) for i in read_labels(path, noisy_only=True).image_ids])
    return ids[0], ids[1]


def gather(runs: list[Path], folds: Path, noisy: Path) -> dict:
    """Every training image's out-of-sample probabilities (see the module docstring); ``runs`` in fold order."""
    from noisymlt.data.labels import read_labels

    record = read_folds(folds)
    if len(runs) != record["folds"]:
        raise NoisyMLTError(f"{len(runs)} runs for {record['folds']} folds ({folds}): one run a fold, in fold order")
    table = read_labels(noisy, noisy_only=True)
    ids = [str(i) for i in table.image_ids]
    if ids != record["image_ids"]:
        raise NoisyMLTError(f"{noisy}: its images are not those {folds} was split from")
    row = {image: k for k, image in enumerate(ids)}
    fold_of = np.asarray(record["fold"])
    probs = np.full((len(ids), len(table.classes)), np.nan, dtype=np.float32)
    run_ids = []
    for k, run in enumerate(runs):
        trained, predicted = _run_tables(run)
        held = {ids[i] for i in np.flatnonzero(fold_of == k)}
        if set(predicted) != held:
            raise NoisyMLTError(f"{run}: it predicted other images than fold {k}'s of {folds}; runs go in fold order")
        seen = held & set(trained)
        if seen:
            raise NoisyMLTError(f"{run}: trained on {len(seen)} image(s) of the fold it predicts, e.g. "
                                f"{sorted(seen)[0]}: not out of sample")
        try:
            with np.load(run / "predictions.npz", allow_pickle=False) as npz:
                head = str(npz["heads"][0])
                scores, image_ids = npz[f"scores_{head}"], [str(i) for i in npz["image_ids"]]
                run_ids.append(str(read_json(run / "manifest.json").get("run_id")))
        except (OSError, KeyError, ValueError) as exc:
            raise NoisyMLTError(f"{run}/predictions.npz: cannot read the run's scores ({exc})") from None
        if image_ids != predicted or scores.shape != (len(predicted), len(table.classes)):
            raise NoisyMLTError(f"{run}/predictions.npz: not the scores of its test table")
        probs[[row[i] for i in image_ids]] = scores
    if np.isnan(probs).any():  # cannot happen when the folds cover every image; kept as the file's promise
        raise NoisyMLTError(f"{folds}: {int(np.isnan(probs).any(1).sum())} image(s) got no probability")
    return {"image_ids": np.array(ids), "classes": np.array(list(table.classes)), "probs": probs,
            "fold": fold_of.astype(np.int64), "runs": np.array([str(r) for r in runs]), "run_ids": np.array(run_ids)}


def write_gathered(gathered: dict, out: Path) -> None:
    from noisymlt.core.files import replacing

    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **gathered)


def _cmd_split(args: argparse.Namespace) -> int:
    from noisymlt.pipeline.selection import named_tables

    rec = write_folds(named_tables(args.noisy), Path(args.out), args.folds, args.seed)
    print(f"{args.out}: {rec['folds']} folds of {', '.join(map(str, rec['images']))} images")
    return 0


def _cmd_parts(args: argparse.Namespace) -> int:
    sizes = write_parts(Path(args.noisy), Path(args.folds), [Path(p) for p in args.train], [Path(p) for p in args.held])
    for train, held, (n_held, n_train) in zip(args.train, args.held, sizes):
        print(f"{train}: {n_train} images; {held}: {n_held} images (noisy labels only)")
    return 0


def _cmd_gather(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".npz":
        raise NoisyMLTError(f"--out {out}: an .npz file")
    gathered = gather([Path(r) for r in args.runs], Path(args.folds), Path(args.noisy))
    write_gathered(gathered, out)
    print(f"{out}: out-of-sample probabilities of {len(gathered['image_ids'])} images from {len(args.runs)} runs")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("crossfit", help="out-of-sample probabilities of the training images by K-fold cross-fitting",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = p.add_subparsers(dest="crossfit_step", metavar="STEP", required=True)
    q = steps.add_parser("split", help="one fold per training image, stratified on the noisy labels (one a dataset)")
    q.add_argument("--noisy", nargs="+", required=True, metavar="NAME=FILE",
                   help="the noisy table of each set of the grid (noisy labels only are read)")
    q.add_argument("--folds", type=int, required=True, help="K, the number of folds (at least 2)")
    q.add_argument("--seed", type=int, required=True)
    q.add_argument("--out", required=True, help="folds file to write (JSON)")
    q.set_defaults(func=_cmd_split)
    q = steps.add_parser("parts", help="one set's noisy table cut into each fold's training and held-out tables")
    q.add_argument("--noisy", required=True, help="noisy label table of one set")
    q.add_argument("--folds", required=True, help="folds file of `noisymlt crossfit split`")
    q.add_argument("--train", nargs="+", required=True,
                   help="for each fold in order, the table of the other folds to write (its run trains on it)")
    q.add_argument("--held", nargs="+", required=True,
                   help="for each fold in order, the table of the fold to write (its run predicts it)")
    q.set_defaults(func=_cmd_parts)
    q = steps.add_parser("gather", help="the fold runs' predictions as every training image's probabilities")
    q.add_argument("--runs", nargs="+", required=True, help="the finished fold runs, in fold order")
    q.add_argument("--folds", required=True, help="folds file of `noisymlt crossfit split`")
    q.add_argument("--noisy", required=True, help="the noisy table of the set the runs were cut from")
    q.add_argument("--out", required=True, help=".npz to write")
    q.set_defaults(func=_cmd_gather)
