"""Collect per-run metrics into one long-format Parquet table with provenance columns.

One row per (run, prediction head, class group or class, metric). Table and figure writers read
only this file, so every reported number has a row that names its run id and input hashes.
Besides the test mAP / AP, every run contributes its fit diagnostics (noisymlt.fit_diagnostics, metrics
``fit_*``, analysis only): run-level ones with no head, per-head ones on the training images, and for the
co-learning family the pseudo-label changes per branch (in ``head``) and ``epoch``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from noisymlt.errors import NoisyMLTError
from noisymlt.labels import GROUPS

COLUMNS = {
    "run_id": "string", "dataset": "string", "method": "string", "gamma": "float64", "seed": "int64",
    "head": "string", "group": "string", "class_name": "string", "metric": "string", "value": "float64",
    "git_commit": "string", "git_dirty": "boolean", "code_digest": "string", "noisy_labels_sha256": "string",
    "manifest": "string", "epoch": "Int64",
}  # no time column: results.parquet is a tracked output (the run's times are in manifest.timing.json)


def rows_for_run(metrics_path: Path) -> list[dict]:
    run_dir = metrics_path.parent
    manifest_path = run_dir / "manifest.json"
    try:
        metrics = json.loads(metrics_path.read_text())
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NoisyMLTError(f"{run_dir}: cannot read metrics/manifest ({exc})") from exc
    run = manifest["run"]
    base = {
        "run_id": manifest["run_id"], "dataset": run["dataset"], "method": run["method"], "gamma": run["gamma"],
        "seed": run["seed"], "git_commit": manifest["git"].get("commit"), "git_dirty": manifest["git"].get("dirty"),
        "code_digest": manifest["code_digest"],
        "noisy_labels_sha256": manifest["inputs"]["train_labels"]["sha256"],
        "manifest": str(manifest_path),
    }
    rows = fit_rows(manifest.get("fit"), base)
    for head, rec in metrics["heads"].items():
        for group in ("total", *GROUPS):
            rows.append({**base, "head": head, "group": group, "class_name": None, "metric": "mAP",
                         "value": rec["map"][group]})
        for cls, ap in zip(metrics["classes"], rec["ap"]):
            rows.append({**base, "head": head, "group": "class", "class_name": cls, "metric": "AP",
                         "value": float("nan") if ap is None else ap})
    return rows


RUN_FIT = ("prior_bce", "final_loss", "lr_nominal", "lr_peak", "warmup_share")
PL_FIT = ("anchors", "added", "added_correct", "removed", "removed_correct", "changed", "precision")


def fit_rows(fit: dict | None, base: dict) -> list[dict]:
    """The fit diagnostics a run's manifest records, as long rows (``fit_<name>``); none for a run
    trained before they existed."""
    if not fit:
        return []
    row = {**base, "group": "total", "class_name": None, "epoch": None}

    def value(v):
        return float("nan") if v is None else float(v)

    rows = [{**row, "head": None, "metric": f"fit_{k}", "value": value(fit[k])} for k in RUN_FIT]
    for head, rec in fit["heads"].items():
        rows += [{**row, "head": head, "metric": f"fit_{k}", "value": value(v)} for k, v in rec.items()]
    for rec in fit["pseudo_labels"]:
        rows += [{**row, "head": rec["branch"], "epoch": rec["epoch"], "metric": f"fit_pl_{k}", "value": value(rec[k])}
                 for k in PL_FIT]
    return rows


def aggregate(metrics_files: list[Path]) -> pd.DataFrame:
    rows = [r for f in metrics_files for r in rows_for_run(Path(f))]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype(COLUMNS)


def _cmd_aggregate(args: argparse.Namespace) -> int:
    files = list(args.metrics)
    if args.runs:
        files += sorted(Path(args.runs).rglob("metrics.json"))
    if not files:
        raise NoisyMLTError("no metrics files given (pass them, or --runs DIR to collect every metrics.json)")
    frame = aggregate(files)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(out)
    print(f"{out}: {frame['run_id'].nunique()} runs, {len(frame)} rows")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("aggregate", help="collect run metrics into a long-format results.parquet",
                       description="One row per run x prediction head x class group (mAP) or class (AP), with the "
                                   "run's provenance (run id, git commit, code digest, noisy-label hash, manifest).")
    p.add_argument("metrics", nargs="*", help="metrics.json files")
    p.add_argument("--runs", help="also collect every metrics.json under this folder")
    p.add_argument("--out", required=True, help="results Parquet to write")
    p.set_defaults(func=_cmd_aggregate)
