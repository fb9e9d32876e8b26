"""Streaming image loading: images are decoded per batch by loader workers, never held in RAM.

A training *stream* is one branch's view of the data: a sampler, a batch size and, for Stitch-Up,
K images per slot (the anchor and its partners). ``EpochPlan`` turns a stream into the epoch's list of
batches, each slot carrying its image indices and its augmentation seed, as a pure function of
(seed, epoch). Workers only decode and augment, so the result does not depend on their number and a
resumed run replays exactly the batches it would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset

from noisymlt.errors import NoisyMLTError
from noisymlt.transforms import eval_transform, train_transform


def load_image(path: Path) -> Image.Image:
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError as exc:
        raise NoisyMLTError(f"{path}: image file is missing") from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise NoisyMLTError(f"{path}: corrupt or unreadable image ({exc})") from exc


class TrainImages(Dataset):
    """Items are ``(indices, aug_seed, stitched)``; returns K augmented views of those images."""

    def __init__(self, root: str | Path, paths: list[str], size: int, photometric: bool = True):
        self.root = Path(root)
        self.paths = paths
        self.size = size
        self.photometric = photometric

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: tuple[tuple[int, ...], int, bool]) -> dict:
        indices, aug_seed, stitched = item
        rng = np.random.default_rng(aug_seed)
        views = [train_transform(load_image(self.root / self.paths[i]), self.size, rng, self.photometric)
                 for i in indices]
        return {"images": torch.stack(views), "index": torch.tensor(indices), "stitched": torch.tensor(stitched)}


class EvalImages(Dataset):
    def __init__(self, root: str | Path, paths: list[str], size: int):
        self.root = Path(root)
        self.paths = paths
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return eval_transform(load_image(self.root / self.paths[i]), self.size)


PartnerFn = Callable[[np.ndarray, np.random.Generator], np.ndarray]


@dataclass
class StreamSpec:
    """One branch's data stream. ``k`` > 1 adds k-1 Stitch-Up partners per slot, applied with prob. ``p``."""

    name: str
    sampler: object  # noisymlt.sampling sampler: indices(epoch) -> np.ndarray
    batch_size: int
    k: int = 1
    p: float = 1.0
    partner_fn: PartnerFn | None = None


class EpochPlan:
    """The batches of one stream for one epoch, deterministic in (seed, epoch)."""

    def __init__(self, stream: StreamSpec, seed: int, iterations: int):
        self.stream = stream
        self.seed = seed
        self.iterations = iterations

    def batches(self, epoch: int) -> list[list[tuple[tuple[int, ...], int, bool]]]:
        s = self.stream
        need = self.iterations * s.batch_size
        chunks, total, j = [], 0, 0
        while total < need:  # a sampler shorter than the epoch is continued with fresh draws
            idx = np.asarray(s.sampler.indices(epoch * 1000 + j))
            if len(idx) == 0:
                raise NoisyMLTError(f"stream {s.name}: sampler produced no indices")
            chunks.append(idx)
            total += len(idx)
            j += 1
        anchors = np.concatenate(chunks)[:need]
        rng = np.random.default_rng([self.seed, epoch, 7919, hash_name(s.name)])
        aug_seeds = rng.integers(0, 2**63 - 1, size=need)
        if s.k > 1 and s.partner_fn is not None:
            stitched = rng.random(need) < s.p
            partners = s.partner_fn(anchors, rng)
        else:
            stitched = np.zeros(need, dtype=bool)
            partners = None
        items = []
        for n, a in enumerate(anchors):
            ids = (int(a),) if partners is None else (int(a), *map(int, partners[n]))
            items.append((ids, int(aug_seeds[n]), bool(stitched[n])))
        return [items[b * s.batch_size:(b + 1) * s.batch_size] for b in range(self.iterations)]


def hash_name(name: str) -> int:
    """A stable small integer for a stream name (Python's hash() is salted per process)."""
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little") % (2**31)


class _ListSampler(torch.utils.data.Sampler):
    def __init__(self, batches: list):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def stream_loader(dataset: TrainImages, batches: list, workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(dataset, batch_sampler=_ListSampler(batches), num_workers=workers,
                      pin_memory=pin_memory, persistent_workers=False)


def eval_loader(dataset: EvalImages, batch_size: int, workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin_memory)
