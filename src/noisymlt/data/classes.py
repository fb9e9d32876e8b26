"""Class lists. VOC's order is fixed by SPEC 1; COCO's comes from the annotation file itself
(position in ``sorted(getCatIds())``), so it is not hard-coded here."""

from __future__ import annotations

VOC_CLASSES: tuple[str, ...] = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
