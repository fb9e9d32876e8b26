"""External files a training run reads besides its dataset: ImageNet weights and GloVe class embeddings.

Each one is a params entry (``assets.imagenet.<backbone>``, ``assets.glove.<kind>``: a URL and its SHA-256)
and is fetched once, by its own pipeline step (`noisymlt fetch-asset`, in noisymlt.data.download; a local rule
under SLURM, so the login node fetches), into ``data/assets/<group>/<stem>-<sha256[:8]><suffix>``: the name
carries the hash, so other bytes (a profile's fixture, a newer release) never take the place of the file a
finished run read.
Run configurations name the file (``train.weights_path``, the method option ``embeddings_file``), so a
train job reads it from disk like any other input and never opens a network connection.

torchvision publishes only the first 8 hex digits of its weights' SHA-256 (in the file name, which is what
``torch.hub`` checks); an entry may give such a prefix (at least 8 digits) and is checked against it.
This module only names and resolves (no I/O): a run's code, which imports it, does not include the downloader.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import urlsplit

ASSET_ROOT = "data/assets"
GROUPS = ("imagenet", "glove")


def asset_path(group: str, url: str, sha256: str) -> str:
    """Where the file of an entry lives: its URL's file name with the hash's first 8 digits before the
    suffix (kept as is when the name already ends with them, as torchvision's do)."""
    name = posixpath.basename(urlsplit(url).path) if urlsplit(url).scheme else Path(url).name
    stem, dot, suffix = name.partition(".")
    tag = sha256[:8].lower()
    if not stem.endswith(f"-{tag}"):
        stem = f"{stem}-{tag}"
    return f"{ASSET_ROOT}/{group}/{stem}{dot}{suffix}"


def entries(params: dict) -> dict[str, dict]:
    """Every configured asset: path -> {group, name, url, sha256}."""
    out = {}
    for group in GROUPS:
        for name, spec in (params.get("assets", {}).get(group) or {}).items():
            out[asset_path(group, spec["url"], spec["sha256"])] = {"group": group, "name": name, **spec}
    return out


def _file_of(params: dict, group: str, key: str) -> str | None:
    spec = (params.get("assets", {}).get(group) or {}).get(key)
    return asset_path(group, spec["url"], spec["sha256"]) if spec else None


def imagenet_file(params: dict, backbone: str) -> str | None:
    return _file_of(params, "imagenet", backbone)


def glove_file(params: dict, kind: str) -> str | None:
    return _file_of(params, "glove", kind)


def with_asset_files(params: dict, kind: str, train: dict, method_cfg: dict) -> tuple[dict, dict]:
    """A run's train block and method options with the asset files they read filled in: ImageNet
    weights for ``pretrained: true`` (unless ``weights_path`` names other weights), GloVe vectors for
    ``embeddings: glove`` on a dataset kind that has them (unless ``embeddings_file`` is set)."""
    if train.get("pretrained") and not train.get("weights_path"):
        path = imagenet_file(params, train["backbone"])
        if path:
            train = {**train, "weights_path": path}
    # ML-GCN's option (methods/mlgcn.py): glove unless a block says random
    if method_cfg.get("family") == "mlgcn" and method_cfg.get("embeddings", "glove") == "glove" \
            and not method_cfg.get("embeddings_file"):
        path = glove_file(params, kind)
        if path:
            method_cfg = {**method_cfg, "embeddings_file": path}
    return train, method_cfg


def run_inputs(resolved: dict) -> dict[str, str]:
    """The asset (or other local) files a resolved run reads besides its data, by role: the backbone weights
    (train.weights_path) and the method's own files (ML-GCN's word vectors, embeddings_file)."""
    files = {"weights": resolved["train"].get("weights_path"), "embeddings": resolved["method_cfg"].get("embeddings_file")}
    return {role: f for role, f in files.items() if f}


def run_files(resolved: dict) -> list[str]:
    """``run_inputs``' files: what a run's train job waits for."""
    return list(run_inputs(resolved).values())
