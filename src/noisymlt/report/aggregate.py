"""Collect per-run metrics into one long-format Parquet table with provenance columns.

One row per (run, prediction head, class group or class, metric). Table and figure writers read
only this file, so every reported number has a row that names its run id and input hashes.
Besides the test mAP / AP, every run contributes its fit diagnostics (noisymlt.training.fit_diagnostics, metrics
``fit_*``, analysis only): run-level ones with no head, per-head ones on the training images, and for the
co-learning family the pseudo-label changes per branch (in ``head``) and ``epoch``.

Optionally also the runs' per-epoch training records (each training manifest's ``history``) as the
flat JSON lists DVC's plots read (``--curves``): one row per run and epoch with the learning rate and
the loss, and, for the co-learning family, one row per run, epoch and branch with the pseudo-label
counts (``--pseudo-label-curves``). DVC reads a list only when all its rows have the same keys, so the
rows carry the keys every method logs, not a method's own (branch losses, BBN's alpha).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from noisymlt.data.labels import GROUPS
from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError
from noisymlt.core.files import read_json, replacing, write_json

COLUMNS = {
    "run_id": "string", "dataset": "string", "method": "string", "gamma": "float64", "noise_model": "string",
    "seed": "int64",
    "head": "string", "group": "string", "class_name": "string", "metric": "string", "value": "float64",
    "git_commit": "string", "git_dirty": "boolean", "code_digest": "string", "noisy_labels_sha256": "string",
    "manifest": "string", "epoch": "Int64", "numerics": "string",
}  # no time column: results.parquet is a tracked output (the run's times are in manifest.timing.json)


def run_noise_model(run: dict) -> str:
    """The noise model of a run's labels: its resolved config's ``noise`` block names one other than the paper's."""
    return (run.get("noise") or {}).get("model", PAPER)


def rows_for_run(metrics_path: Path) -> list[dict]:
    from noisymlt.core.manifest import check_inputs

    run_dir = metrics_path.parent
    manifest_path = run_dir / "manifest.json"
    check_inputs({"metrics": metrics_path})  # against the record of the evaluation that wrote it
    metrics = read_json(metrics_path, "the run's metrics")
    manifest = read_json(manifest_path, "the run's manifest")
    run = manifest["run"]
    base = {
        "run_id": manifest["run_id"], "dataset": run["dataset"], "method": run["method"], "gamma": run["gamma"],
        "noise_model": run_noise_model(run), "seed": run["seed"], "git_commit": manifest["git"].get("commit"), "git_dirty": manifest["git"].get("dirty"),
        "code_digest": manifest["code_digest"],
        "noisy_labels_sha256": manifest["inputs"]["train_labels"]["sha256"],
        "manifest": str(manifest_path),
        # the kernels that made the numbers (noisymlt.training.numerics), as JSON; None for older runs
        "numerics": json.dumps(manifest["numerics"], sort_keys=True) if manifest.get("numerics") else None,
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
    # runs on clean labels: the frozen-trunk probe (fit_probe_map, ...; noisymlt.training.probe)
    rows += [{**row, "head": None, "metric": f"fit_{k}", "value": value(v)} for k, v in fit.get("probe", {}).items()]
    for head, rec in fit["heads"].items():
        rows += [{**row, "head": head, "metric": f"fit_{k}", "value": value(v)} for k, v in rec.items()]
    for rec in fit["pseudo_labels"]:
        rows += [{**row, "head": rec["branch"], "epoch": rec["epoch"], "metric": f"fit_pl_{k}", "value": value(rec[k])}
                 for k in PL_FIT]
    return rows


PSEUDO_LABEL_COUNTS = {"pl_added_": "added", "pl_removed_": "removed"}  # history key prefix -> column


def curve_rows(manifest: dict) -> tuple[list[dict], list[dict]]:
    """One training manifest's history -> (epoch rows, pseudo-label rows), each row naming its run."""
    run = manifest["run"]
    model = run_noise_model(run)
    level = f"{run['gamma']}{'' if model == PAPER else '-' + model}"  # as the run's folder names it
    who = {"run": f"{run['dataset']} g{level} s{run['seed']} {run['method']}", "dataset": run["dataset"],
           "method": run["method"], "gamma": run["gamma"], "seed": run["seed"]}
    epochs, pseudo = [], []
    for record in manifest.get("history", []):
        epochs.append({**who, "epoch": record["epoch"], "lr": record["lr"], "loss": record.get("loss")})
        counts = {k: v for k, v in record.items() if k.startswith(tuple(PSEUDO_LABEL_COUNTS))}
        branches = {}
        for key, value in counts.items():
            prefix = next(p for p in PSEUDO_LABEL_COUNTS if key.startswith(p))
            branches.setdefault(key[len(prefix):], {})[PSEUDO_LABEL_COUNTS[prefix]] = value
        pseudo += [{**who, "epoch": record["epoch"], "branch": b, **c} for b, c in sorted(branches.items())]
    return epochs, pseudo


def write_curves(metrics_files: list[Path], curves: Path, pseudo_labels: Path | None) -> None:
    epochs, pseudo = [], []
    for f in metrics_files:
        manifest_path = Path(f).parent / "manifest.json"
        manifest = read_json(manifest_path, "the run's manifest")
        try:
            e, p = curve_rows(manifest)
        except KeyError as exc:
            raise NoisyMLTError(f"{manifest_path}: cannot read the run's history ({exc!r})") from exc
        epochs += e
        pseudo += p
    for path, rows in ((curves, epochs), (pseudo_labels, pseudo)):
        if path is not None:
            write_json(path, rows, indent=0)


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
    with replacing(out) as tmp:
        frame.to_parquet(tmp, index=False, write_page_checksum=True)  # a damaged page is refused on read
    if args.curves or args.pseudo_label_curves:
        write_curves(files, Path(args.curves) if args.curves else None,
                     Path(args.pseudo_label_curves) if args.pseudo_label_curves else None)
    print(f"{out}: {frame['run_id'].nunique()} runs, {len(frame)} rows")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("aggregate", help="collect run metrics into a long-format results.parquet",
                       description="One row per run x prediction head x class group (mAP) or class (AP), with the "
                                   "run's provenance (run id, git commit, code digest, noisy-label hash, manifest).")
    p.add_argument("metrics", nargs="*", help="metrics.json files")
    p.add_argument("--runs", help="also collect every metrics.json under this folder")
    p.add_argument("--out", required=True, help="results Parquet to write")
    p.add_argument("--curves", help="also write every run's per-epoch learning rate and losses (JSON rows)")
    p.add_argument("--pseudo-label-curves", help="also write the co-learning runs' pseudo-label counts per epoch "
                                                 "and branch (JSON rows)")
    p.set_defaults(func=_cmd_aggregate)
