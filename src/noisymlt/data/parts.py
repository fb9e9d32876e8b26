"""The tables of a held-out part and the rest, from noisy copies of one training set: model selection's fit / val
parts (noisymlt.pipeline.selection) and cross-fitting's folds (noisymlt.pipeline.crossfit), noisy labels only; and
the clean labels in a training table's rows, for what may read them (suspects, the oracle's cleaning, reports)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.errors import NoisyMLTError


def write_cut(table: LabelTable, inside: np.ndarray, inside_out: str | Path, outside_out: str | Path) -> tuple[int, int]:
    """``table``'s rows where ``inside`` (a boolean mask) to INSIDE_OUT, the others to OUTSIDE_OUT, labels only (no
    clean column, no metadata): a held-out part and the rest (model selection's, cross-fitting's). Row counts."""
    inside = np.asarray(inside, dtype=bool)
    for rows, out in ((inside, inside_out), (~inside, outside_out)):
        part = table.subset(np.flatnonzero(rows))
        write_labels(LabelTable(part.image_ids, part.classes, part.labels, part.paths), out)
    return int(inside.sum()), int((~inside).sum())


def read_noisy_copies(tables: dict[str, Path]) -> dict[str, LabelTable]:
    """The noisy labels of ``tables`` ({name: path}), refused in one line unless all are noisy copies of one training
    set (the same images in the same order, the same classes): one split serves them all."""
    read = {name: read_labels(path, noisy_only=True) for name, path in tables.items()}
    first_name, first = next(iter(read.items()))
    for name, table in read.items():
        if table.image_ids != first.image_ids or table.classes != first.classes:
            raise NoisyMLTError(f"{tables[name]}: rows or classes differ from {tables[first_name]}; the sets must be "
                                "noisy copies of one training set")
    return read


def clean_rows(clean: LabelTable, source: str | Path, table: LabelTable) -> np.ndarray:
    """(N, C) uint8: the clean labels ``clean`` (read from ``source``) in the rows and classes of ``table``, image by
    image id; one line naming ``source`` when it lacks a class or an image of ``table``."""
    if list(clean.classes) != list(table.classes):
        raise NoisyMLTError(f"{source}: its classes are not those of the training labels it should hold")
    where = {str(i): k for k, i in enumerate(clean.image_ids)}
    missing = [i for i in table.image_ids if str(i) not in where]
    if missing:
        raise NoisyMLTError(f"{source}: no clean labels for {len(missing)} training image(s), e.g. {missing[0]!r}")
    return np.asarray(clean.labels)[[where[str(i)] for i in table.image_ids]]
