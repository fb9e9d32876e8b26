"""`noisymlt predict`: a finished run's scores and labels for images of one's own, labelled or not.

The images: every image file under a folder (``--images DIR``), the paths a text file lists (``--list FILE``), or
the rows of a label table with the folder its paths are relative to (``--labels TABLE --images DIR``: the run's
own test table gives back its predictions.npz, the same bytes); each path inside its folder, each file decoded by
the conversions noisymlt.data.images states. They are read in batches of the run's
``eval_batch_size`` through the run's own test-time transform (noisymlt.inference.run_model) and never held
whole in memory.

Scores: the sigmoid of each head's logits; the reported head (a two-branch method's ensemble) unless ``--heads``
asks for others (``all``: every head the run has). Labels: a class is predicted where its score reaches its
threshold:

- ``--threshold 0.5`` (the default; any number in (0, 1)): the same for every class;
- ``--threshold train-f1``: per class, the score at which the run's predictions on its own training images (test
  transform) best match its training labels, the noisy ones it was trained on, by F1; from the training data only,
  never the test set. A class with no positive training label is never predicted. These thresholds come from the
  data the model has fitted, so they are the ones a model agrees with itself on, not held-out ones.

Writes OUT (.csv: image, head, one score column a class with 9 significant digits, which a float32 score
survives exactly, then ``predicted``, the classes at or above threshold, joined by ``;``; or .parquet, the same
columns) and OUT's ``.json`` beside it: the run, its run id and checkpoint, the heads, each class's threshold and
how it was set, the transform, the count and the table's sha256. The two reach their names together, once both are
whole; neither may be an input or lie in the run folder.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.inference.run_model import scores_of


def f1_thresholds(labels: np.ndarray, scores: np.ndarray) -> list[float | None]:
    """Per class, the threshold (a score reached by some image) that maximises F1 of ``scores >= threshold``
    against ``labels``; the highest such score on a tie; None for a class without a positive label."""
    labels = np.asarray(labels) > 0.5
    out: list[float | None] = []
    for c in range(labels.shape[1]):
        positives = int(labels[:, c].sum())
        if positives == 0:
            out.append(None)
            continue
        order = np.argsort(-scores[:, c], kind="stable")
        s, y = scores[order, c], labels[order, c]
        tp = np.cumsum(y)
        last_of_tie = np.r_[s[1:] != s[:-1], True]  # a threshold admits every image of its score
        k = np.flatnonzero(last_of_tie)
        f1 = 2 * tp[k] / (k + 1 + positives)
        out.append(float(s[k[int(np.argmax(f1))]]))  # argmax: the first best, the highest score
    return out


def parse_threshold(text: str) -> float | str:
    """An argparse type: train-f1, or a number strictly between 0 and 1."""
    if text == "train-f1":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number in (0, 1) or train-f1") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: outside (0, 1)")
    return value


def thresholds_for(trainer, rule: float | str, heads: list[str], batch_size: int | None) -> dict[str, list]:
    """Each head's per-class thresholds under ``rule`` (a number, or train-f1: from the training images)."""
    classes = trainer.train_table.classes
    if rule != "train-f1":
        return {head: [float(rule)] * len(classes) for head in heads}
    train = scores_of(trainer, trainer.images.eval_dataset("train"), heads, batch_size)  # test transform
    return {head: f1_thresholds(trainer.train_table.labels, train[head]) for head in heads}


def predicted_labels(scores: np.ndarray, classes: list[str], thresholds: list[float | None]) -> list[str]:
    cut = np.array([math.inf if t is None else t for t in thresholds])
    return [";".join(c for c, on in zip(classes, row) if on) for row in scores >= cut]


def select_images(args) -> tuple[list[Path], list[str]]:
    """(files, the names the table gives them) from --images / --list / --labels, each inside its folder
    (noisymlt.inference.images)."""
    from noisymlt.inference.images import image_files, labelled_files, listed_files

    if args.labels:
        if not args.images:
            raise NoisyMLTError("--labels needs --images, the folder its paths are relative to")
        return labelled_files(args.labels, args.images)
    if args.list:
        files = listed_files(args.list)
        return files, [str(p) for p in files]
    if args.images:
        folder = Path(args.images)
        files = image_files(folder)
        return files, [p.relative_to(folder).as_posix() for p in files]
    raise NoisyMLTError("name the images: --images DIR, --list FILE, or --labels TABLE --images DIR")


def write_table(out: Path, names: list[str], classes: list[str], scores: dict[str, np.ndarray],
                thresholds: dict[str, list]) -> None:
    """The scores table at OUT (its .csv or .parquet layout, by OUT's suffix; the caller's temporary name)."""
    columns = ["image", "head", *classes, "predicted"]
    rows = []
    for head, values in scores.items():
        for name, row, labels in zip(names, values, predicted_labels(values, classes, thresholds[head])):
            rows.append([name, head, *(float(v) for v in row), labels])
    if out.suffix == ".parquet":
        import pandas as pd

        frame = pd.DataFrame(rows, columns=columns)
        frame[classes] = frame[classes].astype(np.float32)
        frame.to_parquet(out, index=False)
        return
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for name, head, *values, labels in rows:
            writer.writerow([name, head, *(format(v, ".9g") for v in values), labels])


def _cmd_predict(args: argparse.Namespace) -> int:
    import contextlib

    from noisymlt.core.files import replacing, write_json
    from noisymlt.core.manifest import file_sha256
    from noisymlt.inference.run_model import (check_run_outputs, image_dataset, load_run, recorded_heads,
                                             transform_of)

    out = Path(args.out)
    if out.suffix not in (".csv", ".parquet"):
        raise NoisyMLTError(f"--out {out}: a .csv or .parquet file")
    record_path = out.with_suffix(".json")
    check_run_outputs(Path(args.run), {"--labels": args.labels, "--list": args.list},
                      {"--out": out, "the record": record_path})
    rule = args.threshold
    known = recorded_heads(Path(args.run))
    heads = known[:1] if not args.heads else known if args.heads == ["all"] else args.heads
    unknown = [h for h in heads if h not in known]
    if unknown:
        raise NoisyMLTError(f"--heads {' '.join(unknown)}: the run's heads are {', '.join(known)}")
    files, names = select_images(args)
    trainer = load_run(args.run, device=args.device, train_images=args.train_images)
    scores = scores_of(trainer, image_dataset(files, trainer.cfg), heads, args.batch_size,
                       progress=not args.no_progress)
    classes = list(trainer.train_table.classes)
    thresholds = thresholds_for(trainer, rule, heads, args.batch_size)
    how = ("the same for every class" if rule != "train-f1" else
           "per class, the F1-best score of the run's predictions on its training images against its (noisy) "
           "training labels; null: no positive training label, never predicted")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Both files reach their names only once both are whole (an interrupt leaves neither): the table first, the
    # record, which holds the table's sha256, last.
    with contextlib.ExitStack() as whole:
        record_tmp = whole.enter_context(replacing(record_path))
        table_tmp = whole.enter_context(replacing(out, out.with_name(f"{out.stem}.tmp{out.suffix}")))
        write_table(table_tmp, names, classes, scores, thresholds)
        record = {"run": str(args.run), "run_id": trainer.run_id, "checkpoint_sha256": trainer.checkpoint_sha256,
                  "code_digest": trainer.code_digest, "heads": heads, "images": len(files),
                  "threshold": {"rule": rule, "how": how,
                                "per_class": {h: dict(zip(classes, t)) for h, t in thresholds.items()}},
                  "transform": transform_of(trainer.cfg), "device": str(trainer.device),
                  "table": {"file": out.name, "sha256": file_sha256(table_tmp)}}
        write_json(record_tmp, record)
    print(f"{len(files)} image(s), head(s) {', '.join(heads)}: {out}")
    return 0


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a batch size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return value


def add_cli(sub) -> None:
    p = sub.add_parser(
        "predict", help="a finished run's per-class scores and predicted labels for images of your own",
        description="Score images with a finished training run's model, in batches, with the run's own test-time "
                    "transform: every image under a folder, the paths a text file lists, or a label table's rows. "
                    "Writes a table (image, head, a score a class, predicted labels) and a .json record beside it.",
        epilog="Thresholds: a number (the same for every class; default 0.5) or train-f1 (per class, the F1-best "
               "score on the run's own training images and noisy training labels; never the test set).")
    p.add_argument("--run", required=True, help="a finished run's folder (runs/DATASET/gGAMMA/sSEED/METHOD)")
    p.add_argument("--images", help="a folder of images (all image files under it), or with --labels the folder "
                                    "its paths are relative to")
    p.add_argument("--list", help="a text file of image paths, one a line, relative to the file's folder and inside "
                                  "it")
    p.add_argument("--labels", help="a noisymlt label table (data/.../*.parquet) whose rows to score")
    p.add_argument("--out", required=True, help="the table to write: .csv or .parquet")
    p.add_argument("--heads", nargs="+", help="heads to score (default: the run's reported head; all: every head)")
    p.add_argument("--threshold", type=parse_threshold, default=0.5, help="0 < number < 1, or train-f1 (default 0.5)")
    p.add_argument("--batch-size", type=positive_int, help="images a batch (default: the run's eval_batch_size)")
    p.add_argument("--train-images", help="the run's training image folder, for a run without the image cache")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_predict)
