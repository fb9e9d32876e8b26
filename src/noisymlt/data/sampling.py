"""Training samplers: uniform, class-aware (SPEC 3) and BBN's reversed sampler (SPEC 4), and the streams
they feed.

Each sampler's order for an epoch is a pure function of (seed, epoch): it draws only from
``numpy.random.default_rng([seed, epoch])`` and keeps no state between epochs. Resuming mid-epoch is
then exact (rebuild the sampler, set the epoch, skip the batches already done), and global random
state is never touched. Samplers are built on the noisy training labels; classes without positives
are skipped.

A training *stream* is one branch's view of the data: a sampler, a batch size and, for Stitch-Up,
K images per slot (the anchor and its partners). ``EpochPlan`` turns a stream into the epoch's list of
batches, each slot carrying its image indices and its augmentation seed, as a pure function of
(seed, epoch).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable

import numpy as np
from torch.utils.data import Sampler

from noisymlt.errors import NoisyMLTError


def _nonneg_int(name: str, value: object, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise NoisyMLTError(f"sampler parameter '{name}' must be an integer >= {low}, got {value!r}")
    return int(value)


def _label_matrix(labels: object) -> np.ndarray:
    """The (N, C) 0/1 label matrix as bool, refusing anything else."""
    y = np.asarray(labels)
    if y.ndim != 2 or y.shape[0] == 0 or y.shape[1] == 0:
        raise NoisyMLTError(f"label matrix must be 2-D (images, classes) and non-empty, got shape {y.shape}")
    if y.dtype != bool and not np.isin(y, (0, 1)).all():
        raise NoisyMLTError("label matrix must hold only 0 and 1")
    return y.astype(bool)


def _class_members(y: np.ndarray) -> list[np.ndarray]:
    """Image indices of each class (ascending), raising when no class has any positive."""
    members = [np.flatnonzero(y[:, c]) for c in range(y.shape[1])]
    if not any(m.size for m in members):
        raise NoisyMLTError("label matrix has no positive label in any class: nothing to sample")
    return members


class EpochSampler(Sampler[int]):
    """Base: ``indices(epoch)`` defines the epoch; ``__iter__`` yields it for the current epoch."""

    def __init__(self, seed: int, length: int) -> None:
        super().__init__()
        self.seed = _nonneg_int("seed", seed)
        self.length = length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _nonneg_int("epoch", epoch)

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, _nonneg_int("epoch", epoch)])

    def indices(self, epoch: int) -> np.ndarray:
        """The int64 image indices of ``epoch``, in order."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(self.epoch).tolist())

    def __len__(self) -> int:
        return self.length


class RandomSampler(EpochSampler):
    """A fresh permutation of the n images every epoch."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(seed, _nonneg_int("n", n, low=1))

    def indices(self, epoch: int) -> np.ndarray:
        return self._rng(epoch).permutation(self.length).astype(np.int64)


class _Cycle:
    """Endless walk over a list, reshuffled (with the epoch's generator) before each pass."""

    def __init__(self, items: np.ndarray, rng: np.random.Generator) -> None:
        self.items = items
        self.rng = rng
        self.order = rng.permutation(items)
        self.pos = 0

    def next(self) -> int:
        if self.pos == len(self.order):
            self.order = self.rng.permutation(self.items)
            self.pos = 0
        self.pos += 1
        return int(self.order[self.pos - 1])


class ClassAwareSampler(EpochSampler):
    """Class-aware sampling as in [CL]/[DB] (SPEC 3).

    Classes are visited in a shuffled order, reshuffled after every full cycle; each visit takes
    ``images_per_visit`` consecutive images from that class's own shuffled cycle (each class keeps
    its pointer for the epoch and reshuffles when exhausted). Classes without positives are never
    visited. Epoch length defaults to int(max_class_count * C / 4) (C = all classes), at least 1.
    Unlike [CL], cycles restart every epoch from the (seed, epoch) generator instead of carrying
    over, which keeps each epoch reproducible on its own.
    """

    def __init__(self, labels: object, seed: int, images_per_visit: int = 3, length: int | None = None) -> None:
        y = _label_matrix(labels)
        self.members = _class_members(y)
        self.active = np.array([c for c, m in enumerate(self.members) if m.size], dtype=np.int64)
        self.images_per_visit = _nonneg_int("images_per_visit", images_per_visit, low=1)
        if length is None:
            length = max(1, int(max(m.size for m in self.members) * y.shape[1] / 4))
        super().__init__(seed, _nonneg_int("length", length, low=1))

    def indices(self, epoch: int) -> np.ndarray:
        rng = self._rng(epoch)
        class_cycle = _Cycle(self.active, rng)
        image_cycles = {int(c): _Cycle(self.members[c], rng) for c in self.active}
        out = np.empty(self.length, dtype=np.int64)
        i = 0
        while i < self.length:
            images = image_cycles[class_cycle.next()]
            for _ in range(min(self.images_per_visit, self.length - i)):
                out[i] = images.next()
                i += 1
        return out


class ReversedSampler(EpochSampler):
    """BBN's reversed sampler: class c with probability proportional to n_max / n_c (classes with
    n_c > 0), then an image of c uniformly; independent draws, ``length`` (default N) per epoch."""

    def __init__(self, labels: object, seed: int, length: int | None = None) -> None:
        y = _label_matrix(labels)
        members = _class_members(y)
        counts = np.array([m.size for m in members], dtype=np.int64)
        self.active = np.flatnonzero(counts)
        weights = counts.max() / counts[self.active]
        self.class_prob = weights / weights.sum()
        self.counts = counts
        self.flat = np.concatenate(members).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        super().__init__(seed, _nonneg_int("length", y.shape[0] if length is None else length, low=1))

    def indices(self, epoch: int) -> np.ndarray:
        rng = self._rng(epoch)
        cls = rng.choice(self.active, size=self.length, p=self.class_prob)
        pick = rng.integers(0, self.counts[cls])
        return self.flat[self.offsets[cls] + pick]


def _random_factory(labels: object, seed: int, **kw) -> EpochSampler:
    return RandomSampler(_label_matrix(labels).shape[0], seed, **kw)


# name -> (factory, the class whose keyword parameters the name accepts)
SAMPLERS = {
    "random": (_random_factory, RandomSampler),
    "class_aware": (ClassAwareSampler, ClassAwareSampler),
    "reversed": (ReversedSampler, ReversedSampler),
}
_FIXED = {"self", "labels", "seed", "n"}


def build_sampler(name: str, labels: object, seed: int, **kw: int) -> EpochSampler:
    """The sampler called ``name`` (one of SAMPLERS) over the (noisy) label matrix ``labels``."""
    if name not in SAMPLERS:
        raise NoisyMLTError(f"unknown sampler '{name}'; known samplers: {', '.join(sorted(SAMPLERS))}")
    factory, cls = SAMPLERS[name]
    allowed = set(inspect.signature(cls.__init__).parameters) - _FIXED
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise NoisyMLTError(f"sampler '{name}': unknown parameter(s) {unknown}; accepted: {sorted(allowed) or 'none'}")
    return factory(labels, seed, **kw)


# ---------------------------------------------------------------------------------------- streams

PartnerFn = Callable[[np.ndarray, np.random.Generator], np.ndarray]


@dataclass
class StreamSpec:
    """One branch's data stream. ``k`` > 1 adds k-1 Stitch-Up partners per slot, applied with prob. ``p``."""

    name: str
    sampler: object  # one of the samplers above: indices(epoch) -> np.ndarray
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
