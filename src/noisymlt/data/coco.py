"""COCO instances JSON -> LabelTable (SPEC 1).

Class index = position in ``sorted(coco.getCatIds())``. An annotation is skipped when ``ignore`` is
set, ``area <= 0`` or its box is narrower or lower than 1 pixel; crowd annotations count as
positives. Images without a kept annotation become all-negative rows (about 48 in val2017).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json
from noisymlt.data.labels import LabelTable
from noisymlt.errors import NoisyMLTError

_REQUIRED = {
    "images": ("id", "file_name"),
    "annotations": ("image_id", "category_id", "bbox", "area"),
    "categories": ("id", "name"),
}


def _load_checked(path: Path) -> dict:
    """json + key checks first, so a damaged file fails with its name instead of a pycocotools KeyError."""
    data = read_json(path, "the annotation file")
    if not isinstance(data, dict):
        raise NoisyMLTError(f"{path}: top level must be a JSON object, got {type(data).__name__}")
    for section, keys in _REQUIRED.items():
        items = data.get(section)
        if not isinstance(items, list):
            raise NoisyMLTError(f"{path}: missing or non-list '{section}'")
        for k, item in enumerate(items):
            if not isinstance(item, dict):
                raise NoisyMLTError(f"{path}: {section}[{k}] is not an object")
            missing = [key for key in keys if key not in item]
            if missing:
                raise NoisyMLTError(f"{path}: {section}[{k}] lacks key(s) {missing}")
    if not data["categories"]:
        raise NoisyMLTError(f"{path}: 'categories' is empty")
    image_ids: set[int] = set()
    for k, img in enumerate(data["images"]):
        if not isinstance(img["id"], int) or isinstance(img["id"], bool):
            raise NoisyMLTError(f"{path}: images[{k}] id must be an integer, got {img['id']!r}")
        if img["id"] in image_ids:
            raise NoisyMLTError(f"{path}: images[{k}] repeats image id {img['id']}")
        image_ids.add(img["id"])
    cat_ids = {cat["id"] for cat in data["categories"]}
    for k, ann in enumerate(data["annotations"]):
        if ann["image_id"] not in image_ids:
            raise NoisyMLTError(f"{path}: annotations[{k}] refers to unknown image_id {ann['image_id']!r}")
        if ann["category_id"] not in cat_ids:
            raise NoisyMLTError(
                f"{path}: annotations[{k}] refers to unknown category_id {ann['category_id']!r}"
            )
        bbox = ann["bbox"]
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise NoisyMLTError(f"{path}: annotations[{k}] bbox must be [x, y, w, h], got {bbox!r}")
    return data


def _kept(ann: dict) -> bool:
    _, _, w, h = ann["bbox"]
    return not ann.get("ignore", 0) and ann["area"] > 0 and w >= 1 and h >= 1


def parse_coco(annotation_json: str | Path, image_dir_name: str) -> LabelTable:
    """Labels of every image in a COCO instances file, rows sorted by image id.

    ``image_id`` is the integer id as a string; ``path`` is ``<image_dir_name>/<file_name>``.
    """
    from pycocotools.coco import COCO

    path = Path(annotation_json)
    data = _load_checked(path)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    cat_ids = sorted(coco.getCatIds())
    col = {cid: j for j, cid in enumerate(cat_ids)}
    img_ids = sorted(coco.getImgIds())
    labels = np.zeros((len(img_ids), len(cat_ids)), dtype=np.uint8)
    for row, img_id in enumerate(img_ids):
        for ann in coco.imgToAnns.get(img_id, ()):
            if _kept(ann):
                labels[row, col[ann["category_id"]]] = 1
    images = coco.loadImgs(img_ids)
    return LabelTable(
        image_ids=[str(int(i)) for i in img_ids],
        classes=[str(c["name"]) for c in coco.loadCats(cat_ids)],
        labels=labels,
        paths=[f"{image_dir_name}/{img['file_name']}" for img in images],
        meta={"source": "coco", "annotations": path.name},
    )
