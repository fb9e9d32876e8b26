"""The evaluate step: a run's test-set predictions scored against the clean test labels (AP per class and
mAP per class group, noisymlt.evaluation.metrics), written as metrics.json and map.json with a manifest."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.metrics import average_precisions, summarise

log = logging.getLogger(__name__)


def read_predictions(path: Path, num_classes: int) -> dict[str, np.ndarray]:
    """Every array of a predictions.npz, read now (an .npz decompresses lazily, so a damaged member
    would otherwise fail later with a bare zlib error); each problem names the file and the key."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {key: npz[key] for key in npz.files}
    except FileNotFoundError as exc:
        raise NoisyMLTError(f"{path}: predictions file does not exist") from exc
    except Exception as exc:  # BadZipFile, zlib.error, EOFError, ValueError: truncated or not an .npz
        raise NoisyMLTError(f"{path}: cannot read predictions, the file is damaged or incomplete ({exc})") from exc
    for key in ("image_ids", "heads"):
        if key not in data:
            raise NoisyMLTError(f"{path}: no '{key}' array (keys: {sorted(data)}); not a noisymlt predictions file")
    n = len(data["image_ids"])
    for head in [str(h) for h in data["heads"]]:
        scores = data.get(f"scores_{head}")
        if scores is None:
            raise NoisyMLTError(f"{path}: head '{head}' has no 'scores_{head}' array")
        if scores.shape != (n, num_classes):
            raise NoisyMLTError(f"{path}: scores_{head} has shape {scores.shape}, expected ({n}, {num_classes})")
        if not np.isfinite(scores).all():
            raise NoisyMLTError(f"{path}: scores_{head} holds non-finite values")
    return data


def evaluate_predictions(pred_path: Path, test_labels: Path, split_path: Path) -> dict:
    from noisymlt.data.labels import read_class_split, read_labels

    table = read_labels(test_labels)
    split = read_class_split(split_path)
    data = read_predictions(pred_path, len(table.classes))
    ids = [str(x) for x in data["image_ids"]]
    if ids != table.image_ids:
        raise NoisyMLTError(f"{pred_path}: image ids do not match {test_labels} (different test set or order)")
    result = {"classes": table.classes, "num_test_images": len(ids), "heads": {}}
    missing = np.flatnonzero(~table.labels.any(0))
    if len(missing):
        log.warning("classes without test positives (AP undefined, left out of means): %s",
                    [table.classes[i] for i in missing])
    for head in [str(h) for h in data["heads"]]:
        aps = average_precisions(table.labels, data[f"scores_{head}"])
        result["heads"][head] = {"ap": [None if np.isnan(a) else float(a) for a in aps],
                                 "map": summarise(aps, split)}
    return result


def map_summary(result: dict) -> dict:
    """mAP in percent per prediction head and class group (total, head, medium, tail): the small file
    a person (or `dvc metrics show runs/.../map.json`) reads for a run's table values (as percentages, like the
    tables) without its per-class AP lists. NaN (no class in a group) is null."""
    return {head: {group: None if value is None or np.isnan(value) else 100 * value
                   for group, value in rec["map"].items()}
            for head, rec in result["heads"].items()}


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from noisymlt.core.codedeps import CLI
    from noisymlt.core.files import check_outputs, read_json, write_json
    from noisymlt.core.manifest import check_inputs, now, write_manifest

    started = now()
    out = Path(args.out)
    check_outputs({"--predictions": args.predictions, "--test-labels": args.test_labels, "--split": args.split},
                  {"--out": out, "--map-out": args.map_out, "the manifest": out.with_name(out.stem + ".manifest.json")})
    check_inputs({"predictions": args.predictions})  # against the record of the run that wrote them
    result = evaluate_predictions(Path(args.predictions), Path(args.test_labels), Path(args.split))
    run_manifest = Path(args.predictions).with_name("manifest.json")
    if run_manifest.exists():
        result["run_id"] = read_json(run_manifest, "the run's manifest", require_object=True).get("run_id")
    write_json(out, result)
    outputs = {"metrics": out}
    if args.map_out:
        outputs["map"] = write_json(Path(args.map_out), map_summary(result))
    write_manifest(out.with_name(out.stem + ".manifest.json"), step="evaluate", started=started,
                   inputs={"predictions": args.predictions, "test_labels": args.test_labels, "split": args.split},
                   outputs=outputs, code=(*CLI, __name__))
    for head, rec in result["heads"].items():
        m = rec["map"]
        print(f"{head:>10}: mAP {100 * m['total']:.2f} (head {100 * m['head']:.2f}, "
              f"medium {100 * m['medium']:.2f}, tail {100 * m['tail']:.2f})")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("evaluate", help="AP per class and mAP total/head/medium/tail of a run's predictions",
                       description="Compute average precision (as sklearn's) per class on the clean test labels and mAP "
                                   "over all, head, medium and tail classes, for every prediction head of a run.")
    p.add_argument("--predictions", required=True, help="predictions.npz written by `noisymlt train`")
    p.add_argument("--test-labels", required=True, help="clean test label table")
    p.add_argument("--split", required=True, help="head/medium/tail class split JSON")
    p.add_argument("--out", required=True, help="metrics JSON to write")
    p.add_argument("--map-out", help="also write mAP (%%) per head and class group here (a small metrics file)")
    p.set_defaults(func=_cmd_evaluate)
