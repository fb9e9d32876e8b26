"""Streaming image loading: images are decoded (``pil``) or read from the decoded-image cache (``cache``,
``noisymlt.data.imagecache``) per batch by loader workers, never held in RAM.

The batches come from each stream's ``EpochPlan`` (noisymlt.data.sampling): every slot carries its image
indices and its augmentation seed, a pure function of (seed, epoch). Workers only decode and augment, so
the result does not depend on their number and a resumed run replays exactly the batches it would have seen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from noisymlt.data.imagecache import cache_row
from noisymlt.data.images import load_image
from noisymlt.training.augment import augment, draw_train_params, eval_resize
from noisymlt.training.transforms import eval_transform, train_transform


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
    """Images by path through the test transform (resized to ``size``, normalised), or with ``as_cache`` each as
    the image cache stores it (uint8 (3, size, size), noisymlt.data.imagecache.cache_row), which the device then
    resizes and normalises as it does a cached run's test rows (``CachedEvalImages``)."""

    def __init__(self, root: str | Path, paths: list[str], size: int, as_cache: bool = False):
        self.root = Path(root)
        self.paths = paths
        self.size = size
        self.as_cache = as_cache

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        img = load_image(self.root / self.paths[i])
        if self.as_cache:
            return torch.from_numpy(cache_row(img, self.size)).permute(2, 0, 1)
        return eval_transform(img, self.size)


class CacheRows:
    """Rows of an image-cache array as uint8 (3, S, S) tensors. The memmap is opened lazily in the
    process that reads it: a pickled memmap would carry a copy of the whole array into every worker."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._arr = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "_arr": None}

    @property
    def array(self) -> np.ndarray:
        if self._arr is None:
            self._arr = np.load(self.path, mmap_mode="r")
        return self._arr

    @property
    def size(self) -> int:
        return int(self.array.shape[1])

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def row(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self.array[i])).permute(2, 0, 1)


class CachedTrainImages(Dataset):
    """``TrainImages`` over the image cache. Each view's parameters are drawn here from the slot's
    generator; ``deferred`` (the trainer's choice): the batch carries uint8 views + parameters (``aug``)
    and the trainer augments the whole batch on its device after the transfer (``noisymlt.training.augment.augment``),
    else each slot is augmented here. Per-view ops either way, so both give the same tensors; batching
    amortises the per-op cost (at the demo's 32 px it decides the speed, measured with
    scripts/benchmark_loader.py) and on a GPU moves the pixel work there."""

    def __init__(self, cache: CacheRows, size: int, photometric: bool = True, deferred: bool = False,
                 views: int = 0):
        self.cache = cache
        self.size = size
        self.photometric = photometric
        self.deferred = deferred
        self.views = views  # > 0: each slot picks one of V fixed views per image (noisymlt.training.trunkcache)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, item: tuple[tuple[int, ...], int, bool]) -> dict:
        indices, aug_seed, stitched = item
        rng = np.random.default_rng(aug_seed)
        if self.views:
            return {"view": torch.from_numpy(rng.integers(0, self.views, size=len(indices))),
                    "index": torch.tensor(indices), "stitched": torch.tensor(stitched)}
        s = self.cache.size
        params = torch.from_numpy(np.stack([draw_train_params(rng, s, s, self.photometric) for _ in indices]))
        raw = torch.stack([self.cache.row(i) for i in indices])
        out = {"index": torch.tensor(indices), "stitched": torch.tensor(stitched)}
        if self.deferred:
            return {"images": raw, "aug": params, **out}
        return {"images": augment(raw, params, self.size, self.photometric), **out}

    def __getitems__(self, items: list[tuple[tuple[int, ...], int, bool]]) -> dict | list:
        """A whole ``deferred`` batch at once, as ``batch_collate`` passes it on: what collating the slots
        gives, with one cache read and no per-slot tensors (per-slot work was a third of an ERM step's
        overhead). Each slot's parameters still come from its own generator, in the same order."""
        if not (self.deferred or self.views) or len({len(indices) for indices, _, _ in items}) != 1:
            return [self[item] for item in items]
        stitched = torch.tensor([stitched for _, _, stitched in items])
        index = np.array([indices for indices, _, _ in items], dtype=np.int64)
        if self.views:  # the slots' view choices, as __getitem__ draws them
            view = np.stack([np.random.default_rng(seed).integers(0, self.views, size=len(ind))
                             for ind, seed, _ in items])
            return {"view": torch.from_numpy(view), "index": torch.from_numpy(index), "stitched": stitched}
        s = self.cache.size
        params = np.stack([np.stack([draw_train_params(rng, s, s, self.photometric) for _ in indices])
                           for indices, rng in ((ind, np.random.default_rng(seed)) for ind, seed, _ in items)])
        raw = torch.from_numpy(self.cache.array[index]).permute(0, 1, 4, 2, 3)  # (B, K, 3, S, S)
        return {"images": raw.contiguous(), "aug": torch.from_numpy(params), "index": torch.from_numpy(index),
                "stitched": stitched}


class CachedEvalImages(Dataset):
    """``EvalImages`` over the image cache: uint8 rows when ``deferred`` (resized there), else resized here."""

    def __init__(self, cache: CacheRows, size: int, deferred: bool = False):
        self.cache = cache
        self.size = size
        self.deferred = deferred

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> torch.Tensor:
        raw = self.cache.row(i)
        return raw if self.deferred else eval_resize(raw.unsqueeze(0), self.size)[0]


class EpochBatches(torch.utils.data.Sampler):
    """The batch list of the current epoch; reassigned each epoch so that one loader (and its
    persistent workers) serves every epoch."""

    def __init__(self, batches: list | None = None):
        self.batches = batches or []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def batch_collate(batch: list | dict):
    """A batch that the dataset assembled itself (``CachedTrainImages.__getitems__``) as it is, else the
    slots collated as usual."""
    return batch if isinstance(batch, dict) else default_collate(batch)


def stream_loader(dataset: Dataset, batches: list | None, workers: int, pin_memory: bool) -> DataLoader:
    """A loader whose ``batch_sampler.batches`` is the epoch's plan. Workers only read and augment
    slots whose parameters are fixed by the plan, so their number does not change the batches."""
    return DataLoader(dataset, batch_sampler=EpochBatches(batches), num_workers=workers, collate_fn=batch_collate,
                      pin_memory=pin_memory, persistent_workers=workers > 0)


def eval_loader(dataset: Dataset, batch_size: int, workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin_memory)


def available_cores() -> int:
    """CPU cores this process was given: SLURM_CPUS_PER_TASK under SLURM, else its CPU affinity."""
    import os

    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_workers(setting: int | str, cores: int | None, cpu_threads: int, on_gpu: bool) -> int:
    """Loader worker processes. ``auto``: the job's cores (``cores``, else ``available_cores``) less
    what computes: the torch threads on CPU, the main process on GPU. Batches do not depend on it."""
    if setting != "auto":
        return int(setting)
    cores = cores or available_cores()
    return max(0, min(16, cores - (1 if on_gpu else cpu_threads)))
