"""Benchmark structure (noisymlt.data.structure): each statistic against a plain-loop computation, VOC-MLT's and
COCO-MLT's recorded values against their published label files, and the voc toy's subset held within the stated
tolerance of VOC-MLT (the first toy's is not)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from noisymlt.data import structure
from noisymlt.data.labels import read_class_split
from noisymlt.data.longtail import pareto_subsample
from noisymlt.data.structure import REFERENCE, compare, scaled_thresholds, structure_stats
from noisymlt.data.toy import TOY_CLASSES, make_toy
from noisymlt.data.voc import parse_voc

REPO = Path(__file__).resolve().parents[1]


def _by_loops(y: np.ndarray, head_min: int, tail_max: int, test: list[int]) -> dict:
    """The same statistics with Python sets and loops, written from their definitions."""
    from scipy.stats import rankdata

    images = [set(np.flatnonzero(row).tolist()) for row in y]
    classes = range(y.shape[1])
    count = {c: sum(c in im for im in images) for c in classes}
    group = {c: "head" if count[c] >= head_min else "tail" if count[c] < tail_max else "medium" for c in classes}
    in_group = {g: {c for c in classes if group[c] == g} for g in structure.GROUPS}
    tail_images = [im for im in images if im & in_group["tail"]]
    hub = max(classes, key=lambda c: (count[c], -c))
    exposure = {}
    for g, members in in_group.items():
        aware = sum(sum(len(im & members) for im in images if k in im) / count[k] for k in classes if count[k]) / sum(
            1 for k in classes if count[k])
        exposure[g] = aware / (sum(len(im & members) for im in images) / len(images))
    a, b = rankdata([count[c] for c in classes]), rankdata(test)
    rho = np.corrcoef(a, b)[0, 1]  # Spearman = Pearson on average ranks
    return {"groups": {g: len(m) for g, m in in_group.items()}, "hub_class": hub,
            "labels_per_image": sum(map(len, images)) / len(images),
            "head_share_of_positives": sum(count[c] for c in in_group["head"]) / sum(count.values()),
            "tail_image_share": len(tail_images) / len(images),
            "tail_images_with_head": sum(bool(im & in_group["head"]) for im in tail_images) / len(tail_images),
            "tail_images_with_hub": sum(hub in im for im in tail_images) / len(tail_images),
            "class_aware_exposure": exposure, "train_test_rank_correlation": rho}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_statistic_equals_a_computation_from_its_definition(seed):
    rng = np.random.default_rng(seed)
    rates = np.geomspace(0.6, 0.01, 12)
    y = (rng.random((400, 12)) < rates).astype(np.int64)
    y[:, 0] |= y[:, 6:].any(axis=1)  # the rarer half sits inside images of the most frequent class, as VOC's tail in person
    y = y[y.any(axis=1)]
    test = rng.integers(5, 90, size=12).tolist()
    got = structure_stats(y, test_counts=test, test_images=500, head_min=60, tail_max=15)
    want = _by_loops(y, 60, 15, test)
    for key, value in want.items():
        if isinstance(value, dict):
            assert got[key] == pytest.approx(value, rel=1e-12) if key != "groups" else got[key] == value, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-12), key
    assert got["tail_images_with_hub"] == 1.0  # the planted structure is seen
    assert got["imbalance_ratio"] == y.sum(0).max() / y.sum(0).min()


def test_thresholds_scale_with_the_subset_and_keep_voc_mlts_at_its_size():
    assert scaled_thresholds(1142) == (100, 20)
    assert scaled_thresholds(602) == (53, 11)
    assert scaled_thresholds(10) == (2, 1)


def test_the_recorded_voc_mlt_and_coco_mlt_statistics_are_their_label_files(reference_dir):
    for name, stem, test in (("VOC-MLT", "voc_mlt", structure.VOC2007_TEST_COUNTS), ("COCO-MLT", "coco_mlt", None)):
        frame = pd.read_csv(reference_dir / f"{stem}_train_labels.csv", dtype={"image_id": str})
        stats = structure_stats(frame.iloc[:, 1:].to_numpy(), test_counts=test,
                                test_images=4952 if test else None, head_min=100, tail_max=20)
        recorded = REFERENCE[name]
        assert set(recorded) == set(stats), name
        for key, value in recorded.items():
            if isinstance(value, dict):
                assert stats[key] == pytest.approx(value, abs=5e-5), (name, key)
            else:
                assert stats[key] == pytest.approx(value, abs=5e-5), (name, key)
        # the groups are the published class split's
        split = read_class_split(reference_dir / f"{stem}_class_split.json")
        assert recorded["groups"] == {g: len(split[g]) for g in structure.GROUPS}


def _toy_subset(tmp_path: Path, scenes: str, pool: int, max_count: int, min_count: int):
    root = make_toy(tmp_path / scenes, seed=0, n_trainval=pool, n_test=1000, scenes=scenes)
    trainval, test = parse_voc(root, "trainval"), parse_voc(root, "test")
    assert list(trainval.classes) == list(TOY_CLASSES)
    rows = pareto_subsample(trainval.labels, b=6, max_count=max_count, min_count=min_count, seed=0)
    return structure_stats(trainval.labels[rows], test_counts=test.labels.sum(axis=0), test_images=len(test))


def test_the_demo_toy_has_voc_mlts_structure_within_every_tolerance(tmp_path):
    """The demo's toy (workflow/profiles/demo/params.yaml): its pool, subsampling and group rule give a subset whose
    every statistic lies within TOLERANCE of VOC-MLT's (the structure report `make demo` writes says the same)."""
    import yaml

    layer = yaml.safe_load((REPO / "workflow/profiles/demo/params.yaml").read_text())["datasets"]["toy"]
    assert layer["toy"]["scenes"] == "voc" and layer["longtail"]["groups"] == "scaled"
    stats = _toy_subset(tmp_path, "voc", layer["toy"]["n_trainval"], layer["longtail"]["max"], layer["longtail"]["min"])
    rows = compare(stats)
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    assert stats["hub_class"] == TOY_CLASSES.index(TOY_CLASSES[14])  # glyph 14 stands for person


def test_the_first_toy_fails_the_structure_it_lacked(tmp_path):
    """The check can fail: the glyph toy at the old demo's subsampling has 2 head classes and a tail apart from
    the head (issue 37's table)."""
    stats = _toy_subset(tmp_path, "glyph", 2400, 200, 4)
    failed = {row["statistic"] for row in compare(stats) if row["ok"] is False}
    assert {"groups", "head_share_of_positives", "hub_share_of_images", "class_aware_exposure.tail"} <= failed, failed


def test_the_fitted_scene_file_names_its_fit_and_matches_the_classes():
    record = json.loads((REPO / "src/noisymlt/data/toy_scenes.json").read_text())
    assert record["fit"]["images"] == 11540 and record["fit"]["scenes"] == len(record["weights"]) == 20
    assert len(record["classes"]) == len(TOY_CLASSES) and record["classes"][14] == "person"
    assert abs(sum(record["weights"]) - 1) < 1e-3
