"""Label tables on disk: the one format every pipeline step reads and writes.

Parquet layout: ``image_id`` (string), optional ``path`` (image file, relative to the dataset
root), then one 0/1 column per class in class order. Noisy tables add ``clean_<class>`` columns
holding the clean labels next to the noisy ones (for analysis only; training never reads them). A cleaned table
(noisymlt.pipeline.cleaning, action drop) adds ``ignored_<class>`` columns: 1 where the entry is left out of the
loss.
A CSV laid out like the published reference files (``image_id`` + class columns) is accepted as
input wherever a Parquet table is.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from noisymlt.core.files import read_json, replacing, write_text
from noisymlt.errors import NoisyMLTError, cause

CLEAN_PREFIX = "clean_"
IGNORED_PREFIX = "ignored_"
RESERVED = ("image_id", "path")
GROUPS = ("head", "medium", "tail")


@dataclass
class LabelTable:
    image_ids: list[str]
    classes: list[str]
    labels: np.ndarray  # (n, C) uint8, the labels training sees (noisy ones in a noisy table)
    paths: list[str] | None = None
    clean: np.ndarray | None = None  # (n, C) uint8 clean labels, only in noisy tables
    meta: dict = field(default_factory=dict)
    ignored: np.ndarray | None = None  # (n, C) uint8, 1 = left out of the loss, only in a table cleaned by dropping

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.uint8)
        if self.labels.shape != (len(self.image_ids), len(self.classes)):
            raise ValueError(
                f"labels shape {self.labels.shape} != ({len(self.image_ids)}, {len(self.classes)})"
            )
        if self.clean is not None:
            self.clean = np.asarray(self.clean, dtype=np.uint8)
        if self.ignored is not None:
            self.ignored = np.asarray(self.ignored, dtype=np.uint8)
            if self.ignored.shape != self.labels.shape:
                raise ValueError(f"ignored shape {self.ignored.shape} != labels shape {self.labels.shape}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.image_ids)

    def to_frame(self) -> pd.DataFrame:
        cols: dict[str, object] = {"image_id": pd.array(self.image_ids, dtype="string")}
        if self.paths is not None:
            cols["path"] = pd.array(self.paths, dtype="string")
        for j, name in enumerate(self.classes):
            cols[name] = self.labels[:, j]
        if self.clean is not None:
            for j, name in enumerate(self.classes):
                cols[CLEAN_PREFIX + name] = self.clean[:, j]
        if self.ignored is not None:
            for j, name in enumerate(self.classes):
                cols[IGNORED_PREFIX + name] = self.ignored[:, j]
        return pd.DataFrame(cols)

    def subset(self, rows: np.ndarray | list[int]) -> "LabelTable":
        rows = np.asarray(rows, dtype=np.int64)
        return LabelTable(
            image_ids=[self.image_ids[i] for i in rows],
            classes=list(self.classes),
            labels=self.labels[rows],
            paths=None if self.paths is None else [self.paths[i] for i in rows],
            clean=None if self.clean is None else self.clean[rows],
            ignored=None if self.ignored is None else self.ignored[rows],
            meta=dict(self.meta),
        )


def write_labels(table: LabelTable, path: str | Path) -> Path:
    """Write atomically (noisymlt.core.files.replacing: temp file + rename, the temp file removed when the write
    fails or is interrupted) so an interrupted step never leaves half a table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = table.to_frame()
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(arrow.schema.metadata or {})
    # the columns as written (a reader then names any that went missing since: an edited table) and a digest of
    # each column's values: a flipped byte that still parses (a dictionary page's 1 become 0) is caught on read
    meta[b"noisymlt"] = json.dumps({"classes": table.classes, **table.meta, "columns": list(frame.columns),
                                    "digests": column_digests(frame)}).encode()
    with replacing(path) as tmp:
        pq.write_table(arrow.replace_schema_metadata(meta), tmp, write_page_checksum=True)
    return path


def column_digests(frame: pd.DataFrame) -> dict[str, str]:
    """sha256 (16 hex digits) of each column's values: labels as uint8 bytes, text joined by NUL."""
    import hashlib

    out = {}
    for name in frame.columns:
        col = frame[name]
        data = ("\0".join(col.astype(str)).encode() if not pd.api.types.is_numeric_dtype(col)
                else col.to_numpy().astype(np.uint8).tobytes())
        out[str(name)] = hashlib.sha256(data).hexdigest()[:16]
    return out


def read_labels(path: str | Path, noisy_only: bool = False) -> LabelTable:
    """Read a Parquet label table or a reference-style CSV; errors name the file and the problem.
    ``noisy_only``: a Parquet table's clean_* columns are not even read (model selection must not see them)."""
    path = Path(path)
    if not path.exists():
        raise NoisyMLTError(f"{path}: label file does not exist")
    meta: dict = {}
    try:
        if path.suffix.lower() == ".csv":
            with warnings.catch_warnings():  # a row longer than the header: pandas would take its cells as an index
                warnings.simplefilter("error", pd.errors.ParserWarning)
                frame = pd.read_csv(path, dtype={"image_id": str}, index_col=False)
            if noisy_only:
                frame = frame[[c for c in frame.columns if not str(c).startswith(CLEAN_PREFIX)]]
        else:
            import pyarrow.parquet as pq

            columns = None
            if noisy_only:
                columns = [c for c in pq.read_schema(path).names if not c.startswith(CLEAN_PREFIX)]
            arrow = pq.read_table(path, columns=columns, page_checksum_verification=True)
            raw = (arrow.schema.metadata or {}).get(b"noisymlt")
            meta = json.loads(raw) if raw else {}
            if noisy_only and "columns" in meta:
                meta["columns"] = [c for c in meta["columns"] if not c.startswith(CLEAN_PREFIX)]
            frame = arrow.to_pandas()
    except NoisyMLTError:
        raise
    except Exception as exc:  # pyarrow/pandas raise many types for a damaged file
        hint = "; the file was damaged since it was written: delete it and rerun the workflow to rebuild it" \
            if "checksum" in str(exc).lower() else ""
        raise NoisyMLTError(f"{path}: cannot read label table ({cause(exc)}){hint}") from exc
    if not (isinstance(meta, dict) and all(isinstance(meta.get(k, []), list) for k in ("columns", "classes"))
            and isinstance(meta.get("digests", {}), dict)):
        raise NoisyMLTError(f"{path}: its 'noisymlt' metadata is not the record noisymlt writes (written by another "
                            "tool, or edited?)")
    return _table_from_frame(frame, path, meta)


def _flag_cell(value) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)) and value in (0, 1)


def _table_from_frame(frame: pd.DataFrame, path: Path, meta: dict) -> LabelTable:
    written = meta.get("columns") or (["image_id", *meta["classes"]] if meta.get("classes") else [])
    lost = [c for c in written if c not in frame.columns]
    if lost:
        raise NoisyMLTError(f"{path}: column(s) {lost} missing; the table was written with them (edited since?)")
    recorded = meta.get("digests") or {}
    if recorded and frame[[c for c in frame.columns if c in recorded]].notna().all().all():
        now = column_digests(frame[[c for c in frame.columns if c in recorded]])
        changed = [c for c in now if now[c] != recorded[c]]
        if changed:
            raise NoisyMLTError(f"{path}: column(s) {changed[:3]} no longer hold the values written (digest "
                                f"{recorded[changed[0]]} written, {now[changed[0]]} read): the file was damaged or "
                                "edited since; delete it and rerun the workflow to rebuild it")
    meta = {k: v for k, v in meta.items() if k not in ("columns", "digests")}  # describes this file only
    if "image_id" not in frame.columns:
        raise NoisyMLTError(f"{path}: no 'image_id' column (columns: {list(frame.columns)[:5]}...)")
    class_cols = [c for c in frame.columns
                  if c not in RESERVED and not str(c).startswith((CLEAN_PREFIX, IGNORED_PREFIX))]
    clean_cols = [c for c in frame.columns if str(c).startswith(CLEAN_PREFIX)]
    ignored_cols = [c for c in frame.columns if str(c).startswith(IGNORED_PREFIX)]
    if not class_cols:
        raise NoisyMLTError(f"{path}: no class columns besides {RESERVED}")
    if clean_cols and [c[len(CLEAN_PREFIX):] for c in clean_cols] != class_cols:
        raise NoisyMLTError(f"{path}: clean_* columns do not match the class columns one to one")
    if ignored_cols and [c[len(IGNORED_PREFIX):] for c in ignored_cols] != class_cols:
        raise NoisyMLTError(f"{path}: ignored_* columns do not match the class columns one to one")
    if ignored_cols and not np.isin(frame[ignored_cols].to_numpy(), (0, 1)).all():
        raise NoisyMLTError(f"{path}: ignored_* columns must hold 0 or 1")
    values = frame[class_cols]
    if values.isna().any().any():
        bad = values.columns[values.isna().any()].tolist()
        raise NoisyMLTError(f"{path}: missing label values in column(s) {bad}")
    arr = values.to_numpy()
    # a column of text, lists or mixed cells: judged cell by cell (np.isin fails on a cell holding a sequence)
    ok = (np.vectorize(_flag_cell, otypes=[bool])(arr) if arr.dtype == object and arr.size
          else np.isin(arr, (0, 1)))
    if not ok.all():
        r, c = np.argwhere(~ok)[0]
        raise NoisyMLTError(
            f"{path}: label column '{class_cols[c]}' row {r} holds {arr[r, c]!r}; labels must be 0 or 1"
        )
    ids = frame["image_id"].astype(str).tolist()
    if len(set(ids)) != len(ids):
        dup = frame["image_id"][frame["image_id"].duplicated()].iloc[0]
        raise NoisyMLTError(f"{path}: duplicate image_id {dup!r}")
    return LabelTable(
        image_ids=ids,
        classes=[str(c) for c in class_cols],
        labels=arr.astype(np.uint8),
        paths=frame["path"].astype(str).tolist() if "path" in frame.columns else None,
        clean=frame[clean_cols].to_numpy().astype(np.uint8) if clean_cols else None,
        ignored=frame[ignored_cols].to_numpy().astype(np.uint8) if ignored_cols else None,
        meta=meta,
    )


def write_class_split(split: dict[str, list[int]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, json.dumps({g: [int(i) for i in split[g]] for g in GROUPS}, indent=1) + "\n")


def read_class_split(path: str | Path) -> dict[str, list[int]]:
    """Read head/medium/tail class indices; the published files call 'medium' 'middle'."""
    path = Path(path)
    raw = read_json(path, "class split")
    if not isinstance(raw, dict):
        raise NoisyMLTError(f"{path}: a class split is a mapping of the groups {list(GROUPS)} to class indices, "
                            f"(it holds {json.dumps(raw)[:60]})")
    if "middle" in raw and "medium" not in raw:
        raw["medium"] = raw.pop("middle")
    missing = [g for g in GROUPS if g not in raw]
    if missing:
        raise NoisyMLTError(f"{path}: class split lacks group(s) {missing}")
    try:
        split = {g: sorted(int(i) for i in raw[g]) for g in GROUPS}
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"{path}: class split holds a non-integer class index ({exc})") from exc
    # the groups partition the classes 0..C-1: an edited or damaged file that still parses breaks that
    found = sorted(i for g in GROUPS for i in split[g])
    if found != list(range(len(found))):
        twice = sorted({i for i in found if found.count(i) > 1})
        absent = sorted(set(range(max(found, default=-1) + 1)) - set(found))
        raise NoisyMLTError(f"{path}: the groups do not partition the classes 0..{len(found) - 1} "
                            f"(in two groups: {twice or 'none'}; absent: {absent or 'none'}); rebuild it with "
                            "`noisymlt longtail` (delete it and rerun the workflow)")
    return split


HEAD_MIN, TAIL_MAX = 100, 20  # SPEC 1, on VOC-MLT's clean training images


def split_from_counts(counts: np.ndarray, head_min: int = HEAD_MIN, tail_max: int = TAIL_MAX) -> dict[str, list[int]]:
    """SPEC 1: head >= 100 clean training images, medium 20..99, tail < 20 (other thresholds: a scaled stand-in,
    noisymlt.data.structure.scaled_thresholds)."""
    counts = np.asarray(counts)
    return {
        "head": [int(i) for i in np.flatnonzero(counts >= head_min)],
        "medium": [int(i) for i in np.flatnonzero((counts >= tail_max) & (counts < head_min))],
        "tail": [int(i) for i in np.flatnonzero(counts < tail_max)],
    }
