"""Pascal VOC annotations -> LabelTable.

Every ``<object>`` makes its class positive, ``difficult`` and ``truncated`` ones included (SPEC 1):
there is no ignore mask. The embedded toy dataset uses the same layout and stores its own class
list in ``ImageSets/Main/classes.txt``; when that file exists it replaces the VOC class list.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

import numpy as np

from noisymlt.data.classes import VOC_CLASSES
from noisymlt.data.labels import LabelTable
from noisymlt.errors import NoisyMLTError

CLASS_LIST_FILE = "classes.txt"


def _read_lines(path: Path, what: str) -> list[str]:
    """Non-empty lines, first whitespace-separated token of each."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise NoisyMLTError(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def voc_class_list(root: str | Path) -> list[str]:
    """The class list of a VOC-layout folder: ``ImageSets/Main/classes.txt`` if present, else VOC's 20."""
    path = Path(root) / "ImageSets" / "Main" / CLASS_LIST_FILE
    if not path.exists():
        return list(VOC_CLASSES)
    classes = _read_lines(path, "class list")
    if not classes:
        raise NoisyMLTError(f"{path}: class list is empty")
    if len(set(classes)) != len(classes):
        raise NoisyMLTError(f"{path}: class list has duplicate names")
    return classes


def _object_classes(xml_path: Path, index: dict[str, int]) -> list[int]:
    try:
        tree = ET.parse(xml_path)
    except FileNotFoundError as exc:
        raise NoisyMLTError(f"{xml_path}: annotation file is missing") from exc
    except ET.ParseError as exc:
        raise NoisyMLTError(f"{xml_path}: malformed XML ({exc})") from exc
    except OSError as exc:
        raise NoisyMLTError(f"{xml_path}: cannot read annotation ({exc.strerror or exc})") from exc
    found = []
    for k, obj in enumerate(tree.getroot().iter("object")):
        name = obj.findtext("name")
        if name is None or not name.strip():
            raise NoisyMLTError(f"{xml_path}: <object> number {k + 1} has no <name>")
        name = name.strip()
        if name not in index:
            raise NoisyMLTError(f"{xml_path}: unknown class name {name!r} (known: {', '.join(index)})")
        found.append(index[name])
    if not found:
        raise NoisyMLTError(f"{xml_path}: image has no <object>; every VOC image needs at least one")
    return found


def parse_voc(
    root: str | Path, image_set: str = "trainval", classes: Sequence[str] | None = None
) -> LabelTable:
    """Labels of ``ImageSets/Main/<image_set>.txt`` under a VOC year folder, rows in that file's order.

    ``classes`` defaults to the folder's ``classes.txt`` when present, else VOC_CLASSES. Paths are
    ``JPEGImages/<id>.jpg`` relative to ``root``.
    """
    root = Path(root)
    if not root.is_dir():
        raise NoisyMLTError(f"{root}: VOC folder does not exist")
    class_list = list(classes) if classes is not None else voc_class_list(root)
    index = {name: j for j, name in enumerate(class_list)}
    set_file = root / "ImageSets" / "Main" / f"{image_set}.txt"
    if not set_file.exists():
        raise NoisyMLTError(f"{set_file}: image-set file does not exist (is '{image_set}' the right --image-set?)")
    ids = _read_lines(set_file, "image-set file")
    if not ids:
        raise NoisyMLTError(f"{set_file}: image-set file lists no images")
    seen: set[str] = set()
    for image_id in ids:
        if image_id in seen:
            raise NoisyMLTError(f"{set_file}: image id {image_id!r} listed twice")
        seen.add(image_id)
    labels = np.zeros((len(ids), len(class_list)), dtype=np.uint8)
    for row, image_id in enumerate(ids):
        labels[row, _object_classes(root / "Annotations" / f"{image_id}.xml", index)] = 1
    return LabelTable(
        image_ids=ids,
        classes=class_list,
        labels=labels,
        paths=[f"JPEGImages/{image_id}.jpg" for image_id in ids],
        meta={"source": "voc", "image_set": image_set},
    )
