"""Decoded-image cache: every image of a label table, decoded once, resized to S x S, in one uint8 .npy.

Training used to decode and resize every view from JPEG in every epoch (about 40% of a demo run's time).
``noisymlt cache-images`` decodes each image of a table once (``dataset.load_image``, PIL bilinear resize
to the storage size S, a little larger than the training size so the random crop still has pixels) and
writes it row by row into a memory-mapped (N, S, S, 3) array: the dataset is never held in RAM, and
loader workers read rows through the page cache. Next to ``NAME.npy`` the index ``NAME.json`` records
the row order (image ids and paths), the sha256 of the label table, the storage size and each source
image's size; ``open_cache`` refuses a cache whose rows are not the table's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json
from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)
FORMAT = 1
# What to do about a damaged cache: the workflow rebuilds a deleted one (and reruns the runs that read it,
# which resume from their finished checkpoints), rule all asking for every cache a run reads.
REBUILD = "delete it and rerun the workflow, which rebuilds it (or rebuild it with `noisymlt cache-images`)"


def index_path(array_path: str | Path) -> Path:
    return Path(array_path).with_suffix(".json")


def rows_digest(image_ids, paths) -> str:
    """sha256 of the row order (ids and paths): a table with other labels of the same images (a noisy
    copy of the subset) has the same rows, hence reads the same cache."""
    blob = json.dumps([[str(i) for i in image_ids], [str(p) for p in paths]], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def cache_row(img, size: int) -> np.ndarray:
    """A decoded image (PIL, RGB) as the cache stores it: resized to SIZE x SIZE by PIL's bilinear filter, uint8
    (SIZE, SIZE, 3), a writable array."""
    from PIL import Image

    return np.array(img.resize((size, size), Image.BILINEAR), dtype=np.uint8)


def build_cache(labels: str | Path, images: str | Path, size: int, out: str | Path, progress: bool = True) -> dict:
    """Decode every image of ``labels`` (paths relative to ``images``) into OUT (.npy) + its index (.json)."""
    from tqdm import tqdm

    from noisymlt.data.labels import read_labels
    from noisymlt.core.manifest import file_sha256
    from noisymlt.data.images import load_image

    table = read_labels(labels)
    if table.paths is None:
        raise NoisyMLTError(f"{labels}: no 'path' column; cannot find the images")
    if size < 1:
        raise NoisyMLTError(f"cache size must be >= 1, got {size}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.npy")
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(table), size, size, 3))
    sizes = []
    try:
        for row, rel in enumerate(tqdm(table.paths, desc=f"cache {out.name}", disable=not progress,
                                       dynamic_ncols=True)):
            img = load_image(Path(images) / rel)
            sizes.append([img.width, img.height])
            arr[row] = cache_row(img, size)
        arr.flush()
        del arr
    except BaseException:
        del arr
        tmp.unlink(missing_ok=True)
        raise
    index = {
        "format": FORMAT,
        "labels": str(labels),
        "labels_sha256": file_sha256(labels),
        "rows_sha256": rows_digest(table.image_ids, table.paths),
        "size": size,
        "count": len(table),
        "image_ids": [str(i) for i in table.image_ids],
        "paths": [str(p) for p in table.paths],
        "source_sizes": sizes,
    }
    tmp_index = index_path(out).with_suffix(".json.tmp")
    tmp_index.write_text(json.dumps(index, indent=0) + "\n")
    tmp.replace(out)  # the array first: an index never describes an array that is not there
    tmp_index.replace(index_path(out))
    return index


def open_cache(array_path: str | Path, *, labels: str | Path, image_ids, paths, size: int | None = None) -> np.ndarray:
    """The cache array (read-only memmap), after checking it holds the rows of ``labels`` in its order.

    The label table's sha256 must be the one the cache was built from, or its rows (ids and paths, in
    order) must be the cache's: the noisy copies of a subset read the subset's cache."""
    from noisymlt.core.manifest import file_sha256

    array_path = Path(array_path)
    idx_path = index_path(array_path)
    if not array_path.is_file() or not idx_path.is_file():
        missing = array_path if not array_path.is_file() else idx_path
        raise NoisyMLTError(f"{missing}: image cache is missing; build it with `noisymlt cache-images`")
    index = read_json(idx_path, "the image-cache index", require_object=True)
    if index.get("format") != FORMAT:
        raise NoisyMLTError(f"{idx_path}: image-cache format {index.get('format')!r}, expected {FORMAT}; {REBUILD}")
    same_file = index.get("labels_sha256") == file_sha256(labels)
    if not same_file and index.get("rows_sha256") != rows_digest(image_ids, paths):
        raise NoisyMLTError(
            f"{array_path}: stale image cache: built from {index.get('labels')} (sha256 "
            f"{str(index.get('labels_sha256'))[:12]}), whose rows are not those of {labels}; "
            "rebuild it with `noisymlt cache-images`")
    if size is not None and index.get("size") != size:
        raise NoisyMLTError(f"{array_path}: image cache stores {index.get('size')} px images, the run's "
                            f"train.cache_size is {size}; rebuild it or set train.cache_size: {index.get('size')}")
    try:
        arr = np.load(array_path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise NoisyMLTError(f"{array_path}: unreadable image cache ({exc}); {REBUILD}") from exc
    expect = (len(index["paths"]), index["size"], index["size"], 3)
    if arr.shape != expect or arr.dtype != np.uint8:
        raise NoisyMLTError(f"{array_path}: array of shape {arr.shape} {arr.dtype}, its index says {expect} uint8")
    return arr


def _cmd_cache(args: argparse.Namespace) -> int:
    from noisymlt.core.codedeps import CLI
    from noisymlt.core.manifest import now, write_manifest

    started = now()
    out = Path(args.out)
    index = build_cache(args.labels, args.images, args.size, out, progress=not args.no_progress)
    write_manifest(out.with_name(out.stem + ".manifest.json"), step="cache-images", started=started,
                   inputs={"labels": Path(args.labels)}, outputs={"array": out, "index": index_path(out)},
                   code=(*CLI, __name__), extra={"size": args.size, "count": index["count"]})
    log.info("%s: %d images at %d px", out, index["count"], args.size)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "cache-images", help="decode every image of a label table once into a uint8 array for training",
        description="Decode each image of a label table (paths relative to --images), resize it to SIZE x SIZE "
                    "(bilinear) and write the (N, SIZE, SIZE, 3) uint8 array OUT (.npy, written row by row "
                    "through a memory map) plus its index OUT with .json (row order, label-table sha256, sizes) "
                    "and OUT with .manifest.json.",
    )
    p.add_argument("--labels", required=True, help="label table (Parquet) whose images to cache, in its row order")
    p.add_argument("--images", required=True, help="folder the table's paths are relative to")
    p.add_argument("--size", required=True, type=int, help="storage size S in pixels (train.cache_size)")
    p.add_argument("--out", required=True, help="array to write (.npy); the index goes next to it (.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_cache)
