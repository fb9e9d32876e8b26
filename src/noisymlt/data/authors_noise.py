"""[CL]'s published noisy labels as a noisy label table: the paper's own noise draw beside the pipeline's.

The authors publish the noisy labels of VOC-MLT-Noise and COCO-MLT-Noise as ``appendix.tar.gz`` (a Google Drive
link in their README, "Prepare Data"): per noise rate one ``class_freq_<rate>noise.pkl``, e.g.
``appendix/VOCdevkit/longtail2012/class_freq_0.5noise.pkl``. Their training reads it with ``mmcv.load`` (a pickle)
as a dict and takes ``labels[idx]`` (the noisy 0/1 row) and ``clean_labels[idx]`` of the idx-th image of the
subset's id list (VOC ``img_id.txt``, COCO ``img_id.pkl``, a text file despite its name); its losses read
``class_freq`` and ``neg_class_freq`` from the same file. This module reads such a file safely (allow-listed
unpickling, the caller's sha256 checked first), checks it against the pipeline's own clean long-tailed table (the
clean rows must be the table's, image by image) and writes the noisy table in the table's row order, with the
clean labels in ``clean_*`` columns, and the realised-noise statistics. The file holds the outcome of the noise
only, not which clean label was replaced by which: the statistics leave the transition counts unknown, and
``missing_rate`` (clean positives absent from the noisy set) is a lower bound of the flip rate.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

import numpy as np

from noisymlt.core.files import check_outputs, write_json
from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.data.longtail import parse_id_list, select_ids
from noisymlt.data.noise import noise_stats
from noisymlt.data.safepickle import load_pickle
from noisymlt.errors import NoisyMLTError

ARCHIVE = ("[CL]'s README (github.com/VamosC/CoLearning-meet-StitchUp, section 'Prepare Data') links the noisy "
           "labels as appendix.tar.gz on Google Drive (drive.google.com/file/d/1EC3rIuvUdomg8Qtz795FkEAiygoDpvTa); "
           "unpacked: appendix/VOCdevkit/longtail2012/class_freq_{0.3,0.5,0.7,0.9}noise.pkl and img_id.txt, "
           "appendix/coco/longtail2017/class_freq_{...}noise.pkl and img_id.pkl")
ROWS = ("labels", "clean_labels")  # the per-image rows [CL]'s datasets read (mlltn/datasets/voc.py, get_ann_info)
FREQS = ("class_freq", "neg_class_freq")  # per-class counts its losses read (ResampleLoss, BCELoss)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _sha256_arg(value: str, what: str = "--sha256") -> str:
    sha = str(value).strip().lower()
    if not _SHA256.match(sha):
        raise NoisyMLTError(f"{what}: expected the file's full sha256 (64 hex digits), got {value!r}")
    return sha


def _rows(obj: object, key: str, source: str) -> np.ndarray:
    """One of the file's row arrays as (n, C) uint8: a 2-D array, or a list of equal-length 1-D rows."""
    try:
        arr = np.asarray(obj if isinstance(obj, np.ndarray) else np.stack([np.asarray(r) for r in obj]))
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"{source}: '{key}' is not a matrix of label rows ({exc})") from exc
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise NoisyMLTError(f"{source}: '{key}' has shape {arr.shape}; expected (images, classes)")
    if arr.dtype == object or not np.isin(arr, (0, 1)).all():
        bad = np.argwhere(~np.isin(arr, (0, 1)))
        where = f" (row {bad[0][0]}, column {bad[0][1]}: {arr[tuple(bad[0])]!r})" if len(bad) else ""
        raise NoisyMLTError(f"{source}: '{key}' holds values other than 0 and 1{where}")
    return arr.astype(np.uint8)


def read_authors_pickle(path: str | Path, sha256: str) -> dict:
    """The file's noisy and clean rows (``labels``, ``clean_labels``: (n, C) uint8) and its other keys (``other``:
    key -> array or value), after its bytes matched ``sha256``. Nothing in the file runs (noisymlt.data.safepickle)."""
    path = Path(path)
    expected = _sha256_arg(sha256)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NoisyMLTError(f"{path}: cannot read [CL]'s noisy-label file ({exc.strerror or exc})") from exc
    found = hashlib.sha256(data).hexdigest()
    if found != expected:
        raise NoisyMLTError(f"{path}: sha256 {found} does not match the expected {expected}; the file is not the "
                            "one named (a different noise rate, a damaged download?)")
    obj = load_pickle(data, str(path))
    if not isinstance(obj, dict):
        raise NoisyMLTError(f"{path}: holds a {type(obj).__name__}; [CL]'s file is a dict with keys {list(ROWS)}")
    missing = [k for k in ROWS if k not in obj]
    if missing:
        raise NoisyMLTError(f"{path}: no key(s) {missing} (keys: {sorted(map(str, obj))}); [CL]'s file holds the "
                            f"noisy rows in 'labels' and the clean ones in 'clean_labels'")
    noisy, clean = (_rows(obj[k], k, str(path)) for k in ROWS)
    if noisy.shape != clean.shape:
        raise NoisyMLTError(f"{path}: 'labels' has shape {noisy.shape} but 'clean_labels' {clean.shape}; "
                            "both hold one row per image of the id list")
    return {"labels": noisy, "clean_labels": clean, "other": {str(k): v for k, v in obj.items() if k not in ROWS}}


def _freq_report(other: dict, noisy: np.ndarray, clean: np.ndarray) -> dict:
    """What the file's class_freq / neg_class_freq count: the noisy labels, the clean ones, or neither (their
    losses' class priors come from them)."""
    out: dict = {"other_keys": sorted(other)}
    for key in FREQS:
        if key not in other:
            continue
        try:
            value = np.asarray(other[key], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            out[key] = "not numeric"
            continue
        counts = {"noisy": noisy.sum(axis=0), "clean": clean.sum(axis=0)}
        if key == "neg_class_freq":
            counts = {name: noisy.shape[0] - c for name, c in counts.items()}
        same = [name for name, c in counts.items() if value.shape == c.shape and np.array_equal(value, c)]
        out[key] = "counts the " + " and ".join(same) + " labels" if same else "matches neither label set"
    return out


def _mismatch_hint(table_rows: np.ndarray, file_rows: np.ndarray) -> str:
    ours, theirs = table_rows.sum(axis=0), file_rows.sum(axis=0)
    if not np.array_equal(ours, theirs) and np.array_equal(np.sort(ours), np.sort(theirs)):
        return "; the per-class counts agree up to order: the file's class columns may be in another order"
    return ""


def authors_noisy_table(table: LabelTable, ids: list[str], noisy: np.ndarray, clean: np.ndarray, *,
                        source: str = "pickle", ids_source: str = "id list") -> LabelTable:
    """The noisy table in ``table``'s row order: row k of the file (the k-th id of ``ids``) lands on that image.
    ``table`` is the pipeline's clean long-tailed table; the file's clean rows must equal its rows image by image
    (the same subset, the same class order), else one error names the first differing ids and their count."""
    if table.clean is not None:
        raise NoisyMLTError(f"{source}: the table given as clean labels is itself a noisy table (clean_* columns)")
    n, C = noisy.shape
    if len(ids) != n:
        raise NoisyMLTError(f"{source}: {n} label rows but {ids_source} lists {len(ids)} image ids; the rows follow "
                            "the id list one to one")
    if C != table.num_classes:
        raise NoisyMLTError(f"{source}: {C} classes per row but the clean table has {table.num_classes}")
    if len(ids) != len(table):
        raise NoisyMLTError(f"{ids_source}: {len(ids)} image ids but the clean table holds {len(table)} images; "
                            "the file must cover exactly the table's subset")
    rows = np.asarray(select_ids(table, ids, ids_source), dtype=np.int64)  # table row of the file's row k
    differ = np.flatnonzero((clean != table.labels[rows]).any(axis=1))
    if differ.size:
        raise NoisyMLTError(
            f"{source}: the clean rows of {differ.size} of {n} images differ from the clean table's, first: "
            f"{[ids[k] for k in differ[:5]]}{_mismatch_hint(table.labels[rows], clean)}")
    order = np.empty(n, dtype=np.int64)
    order[rows] = np.arange(n)  # file row of table row r
    return LabelTable(image_ids=list(table.image_ids), classes=list(table.classes), labels=noisy[order],
                      paths=None if table.paths is None else list(table.paths), clean=clean[order],
                      meta=dict(table.meta))


def authors_stats(table: LabelTable, *, file: str, sha256: str, gamma: float | None, extra: dict) -> dict:
    """noise_stats of the realised noise, with what the file cannot tell (the transitions) marked unknown."""
    C = table.num_classes
    stats = noise_stats(table.clean, table.labels, table.classes, np.zeros((C, C), dtype=np.int64), gamma=gamma)
    for key in ("flipped_positives", "flip_rate", "flip_rate_per_class", "transition_counts"):
        stats[key] = None  # [CL]'s file holds the noisy outcome, not which label replaced which
    clean, noisy = table.clean.astype(np.int64), table.labels.astype(np.int64)
    stats["missing_rate_per_class"] = [None if c == 0 else float(m) / float(c)
                                       for m, c in zip((clean & (1 - noisy)).sum(axis=0), clean.sum(axis=0))]
    stats["images_without_noisy_positives"] = int((noisy.sum(axis=1) == 0).sum())
    stats["noise_model"] = "authors"
    stats["source"] = file
    stats["sha256"] = sha256
    stats["file_keys"] = extra
    stats["note"] = ("[CL]'s published noisy labels: the transition counts are unknown; missing_rate (clean "
                     "positives absent from the noisy set) is a lower bound of the flip rate")
    return stats


def make_authors_noisy_table(pickle_path: str | Path, sha256: str, clean_labels: str | Path, ids_path: str | Path,
                             out: str | Path, stats_out: str | Path | None = None,
                             gamma: float | None = None) -> dict:
    """Read [CL]'s file and the pipeline's clean table, write the noisy table (Parquet, atomically) and its stats
    JSON (default: OUT with .json); returns the stats."""
    pickle_path, ids_path, out = Path(pickle_path), Path(ids_path), Path(out)
    stats_out = Path(stats_out) if stats_out else out.with_suffix(".json")
    if out.suffix.lower() != ".parquet":
        raise NoisyMLTError(f"{out}: --out must end in .parquet (a label table is written as Parquet)")
    check_outputs({"--pickle": pickle_path, "--clean-labels": clean_labels, "--ids": ids_path},
                  {"--out": out, "--stats": stats_out})
    sha = _sha256_arg(sha256)
    if gamma is not None and not 0.0 <= float(gamma) <= 1.0:
        raise NoisyMLTError(f"--gamma: noise rate must lie in [0, 1], got {gamma!r}")
    found = read_authors_pickle(pickle_path, sha)
    table = read_labels(clean_labels)
    try:
        text = ids_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NoisyMLTError(f"{ids_path}: cannot read the image id list ({exc})") from exc
    ids = parse_id_list(text, str(ids_path))
    noisy = authors_noisy_table(table, ids, found["labels"], found["clean_labels"], source=str(pickle_path),
                                ids_source=str(ids_path))
    noise = {"model": "authors", "file": pickle_path.name, "sha256": sha}
    if gamma is not None:
        noise["gamma"] = float(gamma)
    noisy.meta = {**noisy.meta, "noise": noise}
    extra = _freq_report(found["other"], found["labels"], found["clean_labels"])
    stats = authors_stats(noisy, file=pickle_path.name, sha256=sha, gamma=None if gamma is None else float(gamma),
                          extra=extra)
    write_labels(noisy, out)
    write_json(stats_out, stats)
    return stats


def _run(args: argparse.Namespace) -> int:
    stats = make_authors_noisy_table(args.pickle, args.sha256, args.clean_labels, args.ids, args.out, args.stats,
                                     args.gamma)
    print(f"{args.out}: {stats['num_images']} images from {stats['source']}: missing rate "
          f"{stats['missing_rate']:.3f}, {stats['wrong_fraction']:.3f} of noisy labels wrong, "
          f"{stats['classes_without_noisy_positives']} class(es) without noisy positives")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "authors-noise",
        help="turn [CL]'s published noisy labels (class_freq_<rate>noise.pkl) into a noisy label table",
        description=(
            "Read one of the noisy-label files the authors of the paper ([CL]) publish, after checking its sha256, "
            "with an unpickler that builds numpy arrays only (a pickle can run code), and write it as a noisy "
            "label table in the clean table's row order (noisy labels in the class columns, clean ones in clean_*) "
            "plus realised-noise statistics. The file's clean rows must equal the clean table's, image by image. "
            f"Where to get it: {ARCHIVE}."),
    )
    p.add_argument("--pickle", required=True, type=Path,
                   help="[CL]'s file, e.g. appendix/VOCdevkit/longtail2012/class_freq_0.5noise.pkl")
    p.add_argument("--sha256", required=True, help="the file's sha256 (all 64 hex digits)")
    p.add_argument("--clean-labels", required=True, type=Path,
                   help="the pipeline's clean long-tailed training table (noisymlt longtail's output)")
    p.add_argument("--ids", required=True, type=Path,
                   help="the subset's id list whose order the file's rows follow (img_id.txt; COCO: img_id.pkl, text)")
    p.add_argument("--out", required=True, type=Path, help="output Parquet table")
    p.add_argument("--stats", type=Path, default=None, help="statistics JSON (default: OUT with .json suffix)")
    p.add_argument("--gamma", type=float, default=None,
                   help="the noise rate the file was drawn at (its name says it: 0.5 for class_freq_0.5noise.pkl); "
                        "recorded only")
    p.set_defaults(func=_run)
