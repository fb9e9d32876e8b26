"""What a dataset kind declares, with the defaults most kinds share.

The pipeline asks a kind, never compares its name: where its raw files come from (``raw_argv``: a command that
writes them, or None when they are the user's own), how a part becomes a label table (``parse_argv``), which folder
a table's image paths are relative to, whether its train images are fetched after the long-tail step, and the
facts that planners and methods read. The words a kind returns are ``noisymlt`` command lines, which Snakemake's rules
run as their `args` params.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from noisymlt.errors import NoisyMLTError

PARTS = ("train_source", "test")  # the parse step's parts: the pool the long-tail step draws from, the test set


class DatasetKind:
    name: str = ""  # set by register_kind
    # block keys of the kind's own settings (datasets.NAME.KEY) -> their JSON schema, checked with the params
    options: dict[str, dict] = {}
    # the number of classes, where the kind fixes it (None: the data tell)
    class_count: int | None = None
    # images of the raw train pool and the test set, where known before any data is there (planning)
    train_pool: int | None = None
    test_images: int | None = None
    # clean per-class counts of a published long-tailed subset: {"images": n, "counts": [...]} (planning)
    published_subset: dict | None = None
    # noisymlt.data.longtail.OfficialList of a published subset's ids (longtail source: official)
    official_list: object | None = None
    # [CL]'s pseudo-label thresholds: source branch -> {"alpha": {group: t}, "beta": {group: t}}; groups left out are
    # off. [CL]'s published VOC-MLT runs (README of VamosC/CoLearning-meet-StitchUp), the default of a kind without
    # published values of its own (the toy mimics VOC-MLT; a user's data until datasets.NAME.colearning sets them)
    thresholds: dict | None = {"random": {"alpha": {"head": 0.7}, "beta": {"tail": 0.1}},
                               "balanced": {"alpha": {"head": 0.7}, "beta": {"tail": 0.1}}}
    # noisymlt.data.download.RemoteFile's the raw files come in (raw_argv: `noisymlt download --dataset NAME`)
    archives: list | None = None
    # rows of a published GloVe class-vector file (ML-GCN), None: no published vectors (pseudo-embeddings)
    glove_rows: int | None = None
    # the train images are fetched for the long-tail subset only, after the long-tail step (train_images_argv)
    fetches_train_images: bool = False

    # ------------------------------------------------------------------ raw files
    def raw_folder(self, block: dict) -> str:
        """The folder under data/raw holding the raw files (shared by datasets of the kind)."""
        return self.name

    def raw_dir(self, block: dict, raw_root: str) -> str:
        """The raw files' folder: ``raw_root``/``raw_folder`` unless the kind reads the user's own folder."""
        return f"{raw_root}/{self.raw_folder(block)}"

    def raw_marker(self, block: dict, raw: str) -> str:
        """A file that exists once the raw files are in place (what the parse step waits for)."""
        return f"{raw}/manifest.json"

    def raw_argv(self, block: dict, raw: str, download_args: list[str]) -> list[str] | None:
        """The command that writes the raw files into ``raw``; None: they are the user's, already in place."""
        return None

    # ------------------------------------------------------------------ label tables
    def parse_argv(self, block: dict, raw: str, part: str, out: str) -> list[str]:
        """The command that writes the label table of ``part`` (one of PARTS) to ``out``."""
        raise NotImplementedError(f"dataset kind {self.name}: parse_argv")

    def image_root(self, block: dict, raw: str, part: str, fetched: str) -> str:
        """The folder the ``path`` column of the train ('train') or test ('test') table is relative to;
        ``fetched``: where fetched train images go (fetches_train_images)."""
        raise NotImplementedError(f"dataset kind {self.name}: image_root")

    def train_images_argv(self, block: dict, raw: str, ids: str, out: str,
                          download_args: list[str]) -> list[str] | None:
        """The command that fetches the subset's train images into ``out`` (fetches_train_images only)."""
        return None

    # ------------------------------------------------------------------ facts for checks and methods
    def problems(self, block: dict, root: Path | None) -> list[tuple[str, str]]:
        """What is wrong with the dataset's block beyond its schema, as (key under datasets.NAME, what), checked with
        the params: settings that exclude each other, and, with the project's folder ``root`` (None: not looked
        up), files it names that are not there."""
        return []

    def training_images_bound(self, block: dict, longtail_max: int) -> int | None:
        """An upper bound on the training images of a dataset of this kind: its pool, and no more than classes x
        the long-tail profile's largest class count; None when unknown before the data are read."""
        if self.train_pool is None or self.class_count is None:
            return None
        return min(self.train_pool, self.class_count * longtail_max)

    def glove_order(self, classes: Sequence[str]):
        """Row of the published GloVe file for each class (an integer array); only kinds with ``glove_rows``."""
        raise NoisyMLTError(f"no published GloVe embeddings for dataset kind {self.name!r}")

    def official_max(self) -> int | None:
        return getattr(self.official_list, "max_count", None)


class _Registry:
    """``@register_kind("name")``: the class's single instance becomes the kind ``name``."""

    def __init__(self) -> None:
        self.KINDS: dict[str, DatasetKind] = {}

    def __call__(self, name: str):
        def deco(cls: type[DatasetKind]) -> type[DatasetKind]:
            if name in self.KINDS and type(self.KINDS[name]) is not cls:
                raise NoisyMLTError(f"dataset kind {name!r} registered twice ({type(self.KINDS[name]).__name__}, "
                                    f"{cls.__name__})")
            cls.name = name
            self.KINDS[name] = cls()
            return cls
        return deco


register_kind = _Registry()
