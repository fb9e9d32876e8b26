"""Files the tests fabricate as the pipeline's steps would leave them, for tests of the steps that read them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from noisymlt.data.labels import LabelTable, write_class_split, write_labels


def fake_run(root, method, gamma, seed, maps, heads=("main",)):
    """A run folder as train + evaluate leave it: files and the manifests that record their hashes."""
    from noisymlt.core.manifest import file_sha256

    run = root / "runs" / "toy" / f"g{gamma:g}" / f"s{seed}" / method
    run.mkdir(parents=True)
    (run / "noisy.parquet").write_bytes(f"{gamma}-{seed}".encode())
    # predictions as `noisymlt train` writes them, down to the code that trained their checkpoint
    np.savez(run / "predictions.npz", run=np.array(f"{method}-{gamma}-{seed}"), code_digest=np.array("d1"))

    def rec(name):
        return {"path": str(run / name), "sha256": file_sha256(run / name)}

    manifest = {
        "run_id": f"{method}-{gamma}-{seed}", "run": {"dataset": "toy", "method": method, "gamma": gamma, "seed": seed},
        "git": {"commit": "abc", "dirty": False}, "code_digest": "d1",
        "inputs": {"train_labels": rec("noisy.parquet")}, "outputs": {"predictions": rec("predictions.npz")},
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    metrics = {"classes": ["a", "b"], "heads": {}}
    for h, m in zip(heads, maps):
        metrics["heads"][h] = {"ap": [m, m], "map": {"total": m, "head": m, "medium": m, "tail": m}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "metrics.manifest.json").write_text(json.dumps(
        {"inputs": {"predictions": rec("predictions.npz")}, "outputs": {"metrics": rec("metrics.json")}}))
    return run / "metrics.json"


# Ten training images of four classes, counted by hand: a 7, b 5, c 2, d 1 (15 labels); the one image with d holds a
TRAIN = ["a", "a b", "a b", "a c", "a", "b", "a d", "b c", "a", "b"]
# Six test images: a 3, b 1, c 4, d 2; two without a label
TEST = ["a c", "a c d", "a b c", "c d", "", ""]
CLASSES = ["a", "b", "c", "d"]
SCALED = {"rule": "scaled", "head_min": 5, "tail_max": 2}  # head: a, b; medium: c; tail: d


def label_table(rows: list[str], meta: dict | None = None) -> LabelTable:
    y = np.array([[c in row.split() for c in CLASSES] for row in rows], dtype=np.uint8)
    return LabelTable([f"im{i:02d}" for i in range(len(rows))], CLASSES, y, meta=meta or {})


def structure_files(tmp_path: Path, groups: dict | None = SCALED, split: dict | None = None) -> dict:
    """TRAIN and TEST written as a dataset's train and test label tables under tmp_path/data/tiny, with a class split."""
    files = {"labels": tmp_path / "data" / "tiny" / "train_labels.parquet",
             "split": tmp_path / "data" / "tiny" / "class_split.json",
             "test_labels": tmp_path / "data" / "tiny" / "test_labels.parquet"}
    write_labels(label_table(TRAIN, {"groups": groups} if groups else None), files["labels"])
    write_labels(label_table(TEST), files["test_labels"])
    write_class_split(split or {"head": [0, 1], "medium": [2], "tail": [3]}, files["split"])
    return files
