"""Class word embeddings for ML-GCN: the GloVe vectors published with ML-GCN, or an offline stand-in.

ML-GCN (Chen et al., CVPR 2019) feeds 300-d GloVe vectors of the class names to its GCN. Its
repository ships them as pickled float32 arrays; the pipeline fetches them from a fixed commit as
assets (noisymlt.data.assets, checked against the SHA-256 given in SPEC 4), and a run unpickles its
file with a restricted unpickler that can only rebuild numpy arrays (noisymlt.data.safepickle: a pickle
can otherwise run arbitrary code).

Offline fallback (``embeddings: random``, and always for the embedded toy dataset, whose glyph
classes have no words): deterministic pseudo-embeddings, one seeded unit-norm Gaussian vector per
class name. ML-GCN then still propagates its label-graph prior (the co-occurrence adjacency), but the
semantic word prior is lost: the GCN inputs carry no similarity between related class names.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from noisymlt.data.safepickle import load_array_pickle  # noqa: F401 (also this module's API)
from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)

EMBEDDING_DIM = 300
# Rows of ML-GCN's files and their order are the dataset kinds' (noisymlt.data.kinds: glove_rows, glove_order);
# URLs and digests: params.yaml assets.glove.


# ------------------------------------------------------------------ GloVe from ML-GCN
def glove_row_order(kind: str, classes: list[str]) -> np.ndarray:
    """Row of the published file for each project class (the kind's order: VOC's is the class order, COCO's the
    class names sorted alphabetically)."""
    from noisymlt.data.kinds import kind_of

    return kind_of(kind).glove_order(classes)


def read_glove(kind: str, classes: list[str], path: str | Path) -> np.ndarray:
    """The vectors of ``path`` (a file fetched by `noisymlt fetch-asset`, which verified its checksum) as a
    float32 (C, 300) array in the project's class order. Only reads the disk: a missing file is an error
    that names the step that fetches it."""
    from noisymlt.data.kinds import all_kinds, kind_of

    rows = kind_of(kind).glove_rows
    if rows is None:
        having = ", ".join(name for name, k in all_kinds().items() if k.glove_rows)
        raise NoisyMLTError(f"no published GloVe embeddings for dataset kind {kind!r} (only {having})")
    if len(classes) != rows:
        raise NoisyMLTError(f"GloVe embeddings for {kind} have {rows} rows, the labels {len(classes)} classes")
    order = glove_row_order(kind, classes)
    path = Path(path)
    if not path.is_file():
        raise NoisyMLTError(
            f"ML-GCN GloVe class embeddings for {kind}: {path} does not exist. The pipeline fetches it before "
            f"training (rule fetch_asset; by hand: `snakemake {path}`); "
            "offline, place the file there (docs/downloads.md) or set "
            "`embeddings: random` in the ML-GCN method block (pseudo-embeddings: keeps the label-graph prior, "
            "loses the semantic word prior).")
    arr = load_array_pickle(path.read_bytes(), str(path))
    if arr.shape != (rows, EMBEDDING_DIM) or not np.issubdtype(arr.dtype, np.floating):
        raise NoisyMLTError(f"{path}: expected a float ({rows}, {EMBEDDING_DIM}) array, "
                            f"got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr[order], dtype=np.float32)


# ------------------------------------------------------------------ offline stand-in
def pseudo_embeddings(classes: list[str], dim: int = EMBEDDING_DIM) -> np.ndarray:
    """One unit-norm Gaussian vector per class, seeded by the SHA-256 of its name: the same name always
    gets the same vector, independent of class order and of any global random state."""
    rows = []
    for name in classes:
        seed = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(dim)
        rows.append(v / np.linalg.norm(v))
    return np.asarray(rows, dtype=np.float32).reshape(len(classes), dim)


def has_glove(kind: str) -> bool:
    """Whether ML-GCN's published word vectors exist for the kind's classes."""
    from noisymlt.data.kinds import kind_of

    return kind_of(kind).glove_rows is not None


def class_embeddings(kind: str, classes: list[str], mode: str, path: str | Path | None) -> np.ndarray:
    """(C, 300) class embeddings: ``mode`` glove (the published vectors in ``path``; a kind without published
    vectors, such as the toy's glyph classes or a user's folder, always gets pseudo-embeddings) or random
    (pseudo-embeddings)."""
    if mode not in ("glove", "random"):
        raise NoisyMLTError(f"embeddings: unknown mode {mode!r}; choose glove or random")
    if mode == "random" or not has_glove(kind):
        if mode == "glove":
            log.info("%s dataset: no published GloVe vectors for its classes; using name-seeded pseudo-embeddings",
                     kind)
        return pseudo_embeddings(classes)
    if not path:
        raise NoisyMLTError(f"ML-GCN GloVe class embeddings for {kind}: no file; add assets.glove.{kind} (url, "
                            "sha256) to the params, or set the method option embeddings_file")
    return read_glove(kind, classes, path)
