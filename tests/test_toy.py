"""The embedded toy dataset: determinism, VOC layout, co-occurrence, skew and long-tail groups."""

from __future__ import annotations

import argparse
import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from noisymlt.data import toy
from noisymlt.data.labels import split_from_counts
from noisymlt.data.longtail import pareto_subsample
from noisymlt.data.toy import GLYPHS, TOY_CLASSES, make_toy, tree_digest
from noisymlt.data.voc import parse_voc
from noisymlt.errors import NoisyMLTError

# Long-tail parameters for the toy demo (20 classes): a VOC-like 4 / 7 / 9 head / medium / tail split.
TOY_PARETO = {"b": 6, "max_count": 400, "min_count": 8}


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    """The default-size dataset, generated once for this module."""
    return make_toy(tmp_path_factory.mktemp("toy"), seed=0)


@pytest.fixture(scope="module")
def trainval(toy_root):
    return parse_voc(toy_root, "trainval")


def read_set(root: Path, name: str) -> list[str]:
    return (root / "ImageSets" / "Main" / f"{name}.txt").read_text().split()


def parse_with_etree(root: Path, ids: list[str]) -> np.ndarray:
    """Labels straight from the XML files, checking every field a VOC reader relies on."""
    index = {c: j for j, c in enumerate(TOY_CLASSES)}
    Y = np.zeros((len(ids), len(TOY_CLASSES)), dtype=np.uint8)
    for r, image_id in enumerate(ids):
        ann = ET.parse(root / "Annotations" / f"{image_id}.xml").getroot()
        assert ann.tag == "annotation"
        assert ann.findtext("filename") == f"{image_id}.jpg"
        assert (int(ann.findtext("size/width")), int(ann.findtext("size/height"))) == (64, 64)
        objects = ann.findall("object")
        assert 1 <= len(objects) <= 4
        for obj in objects:
            assert obj.findtext("difficult") == "0"
            box = [int(obj.findtext(f"bndbox/{k}")) for k in ("xmin", "ymin", "xmax", "ymax")]
            assert 1 <= box[0] < box[2] <= 64 and 1 <= box[1] < box[3] <= 64
            Y[r, index[obj.findtext("name")]] = 1
    return Y


def test_same_seed_same_bytes_different_seed_differs(tmp_path):
    a = tree_digest(make_toy(tmp_path / "a", seed=5, n_trainval=40, n_test=10))
    b = tree_digest(make_toy(tmp_path / "b", seed=5, n_trainval=40, n_test=10))
    c = tree_digest(make_toy(tmp_path / "c", seed=6, n_trainval=40, n_test=10))
    assert len(a) == 2 * 50 + 4  # images, annotations, 3 lists, manifest
    assert a == b
    differ = [k for k in a if a[k] != c[k]]
    assert len(differ) > 90 and "ImageSets/Main/classes.txt" not in differ


def test_rerun_replaces_the_folder_without_stale_files(tmp_path):
    make_toy(tmp_path, seed=0, n_trainval=30, n_test=10)
    root = make_toy(tmp_path, seed=0, n_trainval=12, n_test=4)
    assert len(list((root / "JPEGImages").iterdir())) == 16
    assert sorted(p.name for p in (tmp_path / "VOCdevkit").iterdir()) == ["TOY"]
    assert tree_digest(root) == tree_digest(make_toy(tmp_path / "fresh", seed=0, n_trainval=12, n_test=4))


def test_layout_matches_voc(toy_root, trainval):
    assert toy_root.parts[-2:] == ("VOCdevkit", "TOY")
    assert (toy_root / "ImageSets" / "Main" / "classes.txt").read_text().split() == list(TOY_CLASSES)
    train_ids, test_ids = read_set(toy_root, "trainval"), read_set(toy_root, "test")
    assert (len(train_ids), len(test_ids)) == (2400, 1000)
    assert not set(train_ids) & set(test_ids)
    stems = {p.stem for p in (toy_root / "JPEGImages").iterdir()}
    assert stems == set(train_ids) | set(test_ids) == {p.stem for p in (toy_root / "Annotations").iterdir()}
    for image_id in train_ids[:5] + test_ids[-5:]:
        with Image.open(toy_root / "JPEGImages" / f"{image_id}.jpg") as im:
            assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (64, 64))
    Y = parse_with_etree(toy_root, train_ids)
    assert Y.any(axis=1).all()
    manifest = json.loads((toy_root / "toy_manifest.json").read_text())
    assert manifest["seed"] == 0 and manifest["generator_version"] == toy.GENERATOR_VERSION
    assert manifest["trainval_class_counts"] == Y.sum(axis=0).tolist()
    # the project's VOC parser reads the folder as it is, class list included
    assert trainval.classes == list(TOY_CLASSES) and trainval.image_ids == train_ids
    assert (trainval.labels == Y).all()


def test_small_on_disk(toy_root):
    size = sum(p.stat().st_size for p in toy_root.rglob("*") if p.is_file())
    assert size < 8e6, size


def test_cooccurrence_and_skew(toy_root, trainval):
    Y = trainval.labels.astype(np.float64)
    counts = Y.sum(axis=0)
    assert counts.min() > 0 and counts.max() / counts.min() > 10
    # lift = P(i and j) / (P(i) P(j)); scenes make some frequent pairs co-occur far above independence
    p = Y.mean(axis=0)
    joint = Y.T @ Y / len(Y)
    lift = joint / np.outer(p, p)
    np.fill_diagonal(lift, 0)
    both = Y.T @ Y
    assert lift[both >= 30].max() > 4
    assert ((lift > 2.5) & (both >= 20)).sum() // 2 >= 5
    # while pairs from different scenes rarely meet
    assert (lift < 0.3).sum() >= 20
    # the test split has every class often enough for a meaningful AP
    assert parse_voc(toy_root, "test").labels.sum(axis=0).min() >= 15


@pytest.mark.parametrize(
    ("params", "min_groups"),
    [(TOY_PARETO, (4, 6, 8)), ({"b": 6, "max_count": 250, "min_count": 2}, (2, 4, 10))],
)
def test_pareto_subsampling_gives_head_medium_and_tail(trainval, params, min_groups):
    Y = trainval.labels
    rows = pareto_subsample(Y, seed=0, **params)
    counts = Y[rows].sum(axis=0)
    split = split_from_counts(counts)
    sizes = tuple(len(split[g]) for g in ("head", "medium", "tail"))
    assert all(s >= m for s, m in zip(sizes, min_groups)), (sizes, counts.tolist())
    assert counts.min() >= 2 and counts.max() >= params["max_count"] * 0.9


def test_glyphs_are_distinct():
    assert len(set(TOY_CLASSES)) == len(GLYPHS) == 20
    assert len({(g.shape, g.colour, g.texture) for g in GLYPHS}) == 20
    # rendered at a typical size, any two classes differ in many pixels (shape, colour or texture)
    side = 20
    renders = []
    for c, glyph in enumerate(GLYPHS):
        on, off = toy._glyph_masks(c, side)
        colour = np.array(toy.COLOURS[glyph.colour], dtype=np.float64)
        a = np.asarray(on, dtype=np.float64)[..., None] / 255
        b = 0 if off is None else np.asarray(off, dtype=np.float64)[..., None] / 255
        renders.append(a * colour + b * colour * 0.35 + (1 - a - b) * 128)
    for i, j in itertools.combinations(range(20), 2):
        moved = (np.abs(renders[i] - renders[j]).max(axis=-1) > 60).mean()
        assert moved > 0.1, (TOY_CLASSES[i], TOY_CLASSES[j], moved)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "--seed"),
        ({"n_test": 0}, "--n-trainval/--n-test"),
        ({"image_size": 16}, "--size"),
    ],
)
def test_bad_arguments_refused(tmp_path, kwargs, message):
    with pytest.raises(NoisyMLTError, match=message):
        make_toy(tmp_path, **kwargs)
    assert not (tmp_path / "VOCdevkit").exists()


def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="noisymlt")
    toy.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["make-toy", "--out", str(tmp_path), "--seed", "3", "--n-trainval", "20", "--n-test", "8"]
    )
    assert args.func(args) == 0
    root = tmp_path / "VOCdevkit" / "TOY"
    assert "20 trainval + 8 test images" in capsys.readouterr().out
    assert tree_digest(root) == tree_digest(make_toy(tmp_path / "api", seed=3, n_trainval=20, n_test=8))
