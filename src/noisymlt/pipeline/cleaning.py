"""`noisymlt clean-labels`: a noisy training table with the labels a scorer flags dropped from the loss or flipped,
the training table of a clean-then-retrain method (params ``methods.NAME.clean``), written to a file of its own,
never over its input.

Which labels (``--flags``), each an (image, class) entry:

- ``cleanlab``: cleanlab's confident learning on cross-fitted probabilities (``find_multilabel_issues_per_class``,
  its defaults: noisymlt.inference.suspects.cleanlab_scores), the flags cleanlab's ``CleanLearning`` would act on;
- ``model``: the cross-fitted prediction contradicts the label at 0.5;
- ``oracle``: the labels that differ from the clean ones (``--clean-labels``), the upper bound of what cleaning could
  reach. The only cleaning that reads clean training labels; its methods say so in their name.

What to do with them (``--action``):

- ``drop``: the entries leave the loss (the table's ``ignored_*`` columns; the trainer's loss averages over the
  others). cleanlab's ``CleanLearning`` drops the examples it flags rather than relabel them, and a wrong flag
  then costs one label's signal instead of adding a wrong label: the default.
- ``flip``: the entries take the other value, as a person correcting them would.

Cross-fitted probabilities (noisymlt.pipeline.crossfit) come from models that never saw the label they judge:
in-sample ones would flag little, a fitted label looking right. Writes OUT (.parquet) and OUT with .json: the
flags, the action, and how many entries and images it changed, given positives and given negatives apart; its
inputs with their sha256, so that `noisymlt trace` can walk from a cleaned run to the fold runs behind its flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError

FLAGS = ("cleanlab", "model", "oracle")
ACTIONS = ("drop", "flip")


def flagged_entries(noisy: np.ndarray, flags: str, probs: np.ndarray | None = None,
                    clean: np.ndarray | None = None) -> np.ndarray:
    """(N, C) bool: the entries of ``noisy`` (given 0/1 labels) that ``flags`` marks (see the module docstring)."""
    from noisymlt.inference.suspects import cleanlab_scores, model_scores

    given = np.asarray(noisy, dtype=np.float64)
    if flags == "oracle":
        return (np.asarray(clean) > 0.5) != (given > 0.5)
    scorer = cleanlab_scores if flags == "cleanlab" else model_scores
    return np.asarray(scorer(given, probs).flagged, dtype=bool)


def cleaned_table(table, flagged: np.ndarray, action: str):
    """``table`` (noisy labels) with the ``flagged`` entries dropped (ignored_* columns) or flipped."""
    from noisymlt.data.labels import LabelTable

    labels = np.asarray(table.labels, dtype=np.uint8)
    if action == "flip":
        return LabelTable(table.image_ids, table.classes, np.where(flagged, 1 - labels, labels), table.paths)
    return LabelTable(table.image_ids, table.classes, labels, table.paths, ignored=flagged.astype(np.uint8))


def clean_labels(noisy: Path, out: Path, *, flags: str, action: str, out_of_sample: Path | None = None,
                 clean_labels: Path | None = None) -> dict:
    """Write the cleaned table OUT and its record OUT.json (see the module docstring); the record."""
    import contextlib

    from noisymlt.core.files import replacing, write_json
    from noisymlt.core.manifest import file_sha256
    from noisymlt.data.labels import read_labels, write_labels
    from noisymlt.data.parts import clean_rows
    from noisymlt.inference.suspects import read_out_of_sample

    if flags not in FLAGS or action not in ACTIONS:
        raise NoisyMLTError(f"--flags {flags} --action {action}: flags one of {', '.join(FLAGS)}, action one of "
                            f"{', '.join(ACTIONS)}")
    if (flags == "oracle") != (clean_labels is not None) or (flags != "oracle") != (out_of_sample is not None):
        raise NoisyMLTError(f"--flags {flags}: " + ("the oracle reads --clean-labels, not --out-of-sample"
                                                    if flags == "oracle" else
                                                    "reads --out-of-sample (cross-fitted probabilities), never "
                                                    "--clean-labels"))
    table = read_labels(noisy, noisy_only=True)
    if table.ignored is not None:
        raise NoisyMLTError(f"{noisy}: already cleaned (it has ignored_* columns); clean the noisy table itself")
    probs = clean = folds = None
    if out_of_sample is not None:
        probs, folds = read_out_of_sample(out_of_sample, table)
    else:
        clean = clean_rows(read_labels(clean_labels), clean_labels, table)
    flagged = flagged_entries(table.labels, flags, probs, clean)
    given = np.asarray(table.labels) > 0.5
    level = {"gamma": float(table.meta.get("gamma", 0.0)), "seed": table.meta.get("seed"),
             "noise_model": (table.meta.get("noise") or {}).get("model", PAPER)}  # the noisy set's, as noise wrote it
    source = {"noisy": noisy, **({"out_of_sample": out_of_sample} if clean is None else {"clean_labels": clean_labels})}
    record = {"inputs": {name: {"path": str(path), "sha256": file_sha256(path)} for name, path in source.items()},
              **level, "flags": flags, "action": action, "entries": int(flagged.size),
              "changed": int(flagged.sum()), "changed_positives": int((flagged & given).sum()),
              "changed_negatives": int((flagged & ~given).sum()), "images": len(table.image_ids),
              "images_changed": int(flagged.any(1).sum()),
              "per_class": dict(zip(table.classes, flagged.sum(0).astype(int).tolist()))}
    if out_of_sample is not None:
        record["out_of_sample_folds"] = folds
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as whole:  # the table and its record reach their names together
        record_tmp = whole.enter_context(replacing(out.with_suffix(".json")))
        write_labels(cleaned_table(table, flagged, action), whole.enter_context(replacing(out)))
        write_json(record_tmp, record)
    return record


def _cmd_clean(args: argparse.Namespace) -> int:
    from noisymlt.core.files import check_outputs

    out = Path(args.out)
    if out.suffix != ".parquet":
        raise NoisyMLTError(f"--out {out}: a .parquet file (its record goes beside it as .json)")
    check_outputs({"--noisy": args.noisy, **({"--out-of-sample": args.out_of_sample} if args.out_of_sample else {}),
                   **({"--clean-labels": args.clean_labels} if args.clean_labels else {})},
                  {"--out": out, "--out's record": out.with_suffix(".json")})
    record = clean_labels(Path(args.noisy), out, flags=args.flags, action=args.action,
                          out_of_sample=Path(args.out_of_sample) if args.out_of_sample else None,
                          clean_labels=Path(args.clean_labels) if args.clean_labels else None)
    print(f"{out}: {args.action} {record['changed']} of {record['entries']} labels ({record['changed_positives']} "
          f"given 1, {record['changed_negatives']} given 0) in {record['images_changed']} of {record['images']} "
          f"images, flagged by {args.flags}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("clean-labels", help="a noisy training table with the flagged labels dropped or flipped",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--noisy", required=True, help="the noisy training labels to clean (read, never written)")
    p.add_argument("--flags", choices=FLAGS, default="cleanlab", help="which labels to change (default cleanlab)")
    p.add_argument("--action", choices=ACTIONS, default="drop", help="drop them from the loss or flip them "
                                                                     "(default drop)")
    p.add_argument("--out-of-sample", help="cross-fitted probabilities of its images (`noisymlt crossfit gather`)")
    p.add_argument("--clean-labels", help="the clean labels, for --flags oracle only")
    p.add_argument("--out", required=True, help="the cleaned table to write (.parquet)")
    p.set_defaults(func=_cmd_clean)
