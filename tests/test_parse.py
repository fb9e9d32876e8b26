"""VOC and COCO label parsing on tiny hand-written annotation files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from noisymlt.data import parse as parse_cmd
from noisymlt.data.classes import VOC_CLASSES
from noisymlt.data.coco import parse_coco
from noisymlt.data.labels import read_labels
from noisymlt.data.voc import parse_voc
from noisymlt.errors import NoisyMLTError


def _voc_xml(objects: list[tuple[str, int]]) -> str:
    body = "".join(
        f"<object><name>{name}</name><truncated>0</truncated><difficult>{difficult}</difficult>"
        "<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>"
        for name, difficult in objects
    )
    return f"<annotation><filename>x.jpg</filename>{body}</annotation>"


def _voc_tree(root: Path, images: dict[str, list[tuple[str, int]]], image_set: str = "trainval") -> Path:
    (root / "Annotations").mkdir(parents=True)
    (root / "ImageSets" / "Main").mkdir(parents=True)
    for image_id, objects in images.items():
        (root / "Annotations" / f"{image_id}.xml").write_text(_voc_xml(objects))
    (root / "ImageSets" / "Main" / f"{image_set}.txt").write_text("\n".join(sorted(images)) + "\n")
    return root


VOC_IMAGES = {
    "2008_000002": [("tvmonitor", 0)],
    "2008_000003": [("person", 0), ("train", 0), ("person", 1)],
    "2008_000007": [("car", 1)],  # only a difficult object: still positive
}


def test_voc_labels_paths_and_order(tmp_path):
    table = parse_voc(_voc_tree(tmp_path / "VOC2012", VOC_IMAGES), "trainval")
    assert table.classes == list(VOC_CLASSES)
    assert table.image_ids == ["2008_000002", "2008_000003", "2008_000007"]
    assert table.paths == [f"JPEGImages/{i}.jpg" for i in table.image_ids]
    positives = [[VOC_CLASSES[j] for j in np.flatnonzero(row)] for row in table.labels]
    assert positives == [["tvmonitor"], ["person", "train"], ["car"]]
    assert table.labels.dtype == np.uint8 and table.labels.sum() == 4


def test_voc_class_list_file_replaces_voc_classes(tmp_path):
    root = _voc_tree(tmp_path / "toy", {"a1": [("disc", 0)], "a2": [("ring", 0), ("bar", 1)]})
    (root / "ImageSets" / "Main" / "classes.txt").write_text("bar\ndisc\nring\n")
    table = parse_voc(root, "trainval")
    assert table.classes == ["bar", "disc", "ring"]
    np.testing.assert_array_equal(table.labels, [[0, 1, 0], [1, 0, 1]])


@pytest.mark.parametrize(
    "xml, problem",
    [
        (_voc_xml([("unicorn", 0)]), "unknown class name 'unicorn'"),
        ("<annotation><object><name>cat</name>", "malformed XML"),
        ("<annotation><object><difficult>0</difficult></object></annotation>", "has no <name>"),
        ("<annotation><filename>x.jpg</filename></annotation>", "no <object>"),
    ],
)
def test_voc_bad_annotation_names_file(tmp_path, xml, problem):
    root = _voc_tree(tmp_path / "VOC2012", VOC_IMAGES)
    (root / "Annotations" / "2008_000003.xml").write_text(xml)
    with pytest.raises(NoisyMLTError, match=problem) as err:
        parse_voc(root, "trainval")
    assert "2008_000003.xml" in str(err.value)


def test_voc_missing_annotation_and_image_set(tmp_path):
    root = _voc_tree(tmp_path / "VOC2012", VOC_IMAGES)
    (root / "Annotations" / "2008_000007.xml").unlink()
    with pytest.raises(NoisyMLTError, match=r"2008_000007\.xml: annotation file is missing"):
        parse_voc(root, "trainval")
    with pytest.raises(NoisyMLTError, match=r"test\.txt: image-set file does not exist"):
        parse_voc(root, "test")


def _coco_json(path: Path) -> Path:
    data = {
        "images": [
            {"id": 42, "file_name": "000000000042.jpg"},
            {"id": 7, "file_name": "000000000007.jpg"},
            {"id": 300, "file_name": "000000000300.jpg"},
            {"id": 9, "file_name": "000000000009.jpg"},
        ],
        # non-contiguous ids listed out of order: column = position in sorted ids (3, 11, 90)
        "categories": [{"id": 90, "name": "toothbrush"}, {"id": 3, "name": "car"}, {"id": 11, "name": "fire hydrant"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 3, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},
            {"id": 2, "image_id": 7, "category_id": 90, "bbox": [0, 0, 10, 10], "area": 50, "iscrowd": 0, "ignore": 1},
            {"id": 3, "image_id": 42, "category_id": 11, "bbox": [0, 0, 10, 10], "area": 0, "iscrowd": 0},
            {"id": 4, "image_id": 42, "category_id": 90, "bbox": [0, 0, 0.5, 10], "area": 5, "iscrowd": 0},
            {"id": 5, "image_id": 42, "category_id": 3, "bbox": [0, 0, 10, 0.9], "area": 9, "iscrowd": 0},
            {"id": 6, "image_id": 300, "category_id": 90, "bbox": [0, 0, 20, 20], "area": 400, "iscrowd": 1},
            {"id": 7, "image_id": 300, "category_id": 11, "bbox": [2, 2, 1, 1], "area": 1, "iscrowd": 0},
        ],
    }
    path.write_text(json.dumps(data))
    return path


def test_coco_labels_filters_and_order(tmp_path):
    table = parse_coco(_coco_json(tmp_path / "instances_val2017.json"), "val2017")
    assert table.classes == ["car", "fire hydrant", "toothbrush"]
    assert table.image_ids == ["7", "9", "42", "300"]
    assert table.paths == ["val2017/000000000007.jpg", "val2017/000000000009.jpg",
                           "val2017/000000000042.jpg", "val2017/000000000300.jpg"]
    expected = [
        [1, 0, 0],  # image 7: car; the ignored toothbrush is dropped
        [0, 0, 0],  # image 9: no annotation at all -> all-negative row
        [0, 0, 0],  # image 42: area 0, width 0.5, height 0.9 all skipped
        [0, 1, 1],  # image 300: crowd toothbrush counts; a 1x1 box is kept
    ]
    np.testing.assert_array_equal(table.labels, expected)


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"images": [', "cannot read the annotation file"),
        ('[1, 2]', "top level must be a JSON object"),
        ('{"images": [], "annotations": []}', "missing or non-list 'categories'"),
        ('{"images": [{"id": 1}], "annotations": [], "categories": [{"id": 1, "name": "a"}]}',
         r"images\[0\] lacks key\(s\) \['file_name'\]"),
        ('{"images": [{"id": 1, "file_name": "a.jpg"}], "categories": [{"id": 1, "name": "a"}], '
         '"annotations": [{"image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 1], "area": 1}]}',
         "unknown image_id 2"),
    ],
)
def test_coco_malformed_names_file(tmp_path, capsys, content, problem):
    path = tmp_path / "instances_bad.json"
    path.write_text(content)
    with pytest.raises(NoisyMLTError, match=problem) as err:
        parse_coco(path, "x")
    assert str(path) in str(err.value)
    assert capsys.readouterr().out == ""


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parse_cmd.add_cli(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_parse_cli_voc_and_coco(tmp_path, capsys):
    root = _voc_tree(tmp_path / "VOC2012", VOC_IMAGES)
    assert _cli(["parse", "--format", "voc", "--source", str(root), "--out", str(tmp_path / "voc.parquet")]) == 0
    voc = read_labels(tmp_path / "voc.parquet")
    assert voc.image_ids == ["2008_000002", "2008_000003", "2008_000007"]
    assert voc.classes == list(VOC_CLASSES) and int(voc.labels.sum()) == 4
    assert voc.paths[0] == "JPEGImages/2008_000002.jpg"

    source = _coco_json(tmp_path / "instances_val2017.json")
    assert _cli(["parse", "--format", "coco", "--source", str(source), "--out", str(tmp_path / "coco.parquet")]) == 0
    coco = read_labels(tmp_path / "coco.parquet")
    assert coco.image_ids == ["7", "9", "42", "300"]
    assert coco.paths[0] == "val2017/000000000007.jpg"  # folder inferred from the JSON name
    assert "4 images, 3 classes" in capsys.readouterr().out
