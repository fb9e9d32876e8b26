"""Stitch-Up (paper Sec. 3.2, SPEC 3) and the Mix-Up ablation, as pure functions.

Stitch-Up pairs every anchor with K-1 partners that share one of its noisy positive classes,
combines them (average of neck features by default, or concatenation of feature maps / images
along the width) and supervises the result with the union of their labels. A class that is
wrong on one image is often right on the other, so the union is cleaner than either label set
(paper: presence probability 1 - gamma^2 instead of 1 - gamma for K = 2). The trainer wires
these functions to the model; nothing here touches a network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.methods.options import NEGATIVE_TARGETS

ElementwiseLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _binary_matrix(Y: np.ndarray, what: str) -> np.ndarray:
    Y = np.asarray(Y)
    if Y.ndim != 2:
        raise NoisyMLTError(f"{what}: label matrix must be 2-D (images x classes), got shape {Y.shape}")
    if not np.isin(Y, (0, 1)).all():
        raise NoisyMLTError(f"{what}: labels must be 0 or 1")
    return Y.astype(bool)


class PartnerIndex:
    """Which images carry each noisy class, for drawing Stitch-Up partners in O(batch).

    Built once per training set on the noisy labels (the only labels training may read).
    Images of class c are stored contiguously in ``members[starts[c]:starts[c] + counts[c]]``,
    and the positive classes of row i in ``row_classes[row_starts[i]:row_starts[i] + row_counts[i]]``.
    """

    def __init__(self, noisy_Y: np.ndarray) -> None:
        Y = _binary_matrix(noisy_Y, "stitch-up partner index")
        self.num_images, self.num_classes = Y.shape
        rows, cols = np.nonzero(Y)  # row-major: grouped by image
        self.row_classes = cols.astype(np.int64)
        self.row_counts = Y.sum(axis=1).astype(np.int64)
        self.row_starts = np.concatenate(([0], np.cumsum(self.row_counts)[:-1])).astype(np.int64)
        by_class = np.argsort(cols, kind="stable")
        self.members = rows[by_class].astype(np.int64)
        self.counts = Y.sum(axis=0).astype(np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64)

    def images_of(self, cls: int) -> np.ndarray:
        """Indices of the images whose noisy labels contain class ``cls`` (ascending)."""
        return self.members[self.starts[cls] : self.starts[cls] + self.counts[cls]]

    def sample(
        self, anchor_indices: Sequence[int] | np.ndarray, rng: np.random.Generator, k: int = 2
    ) -> np.ndarray:
        """Draw K-1 partners per anchor; returns an int64 array of shape (B, k-1).

        For each anchor one of its noisy positive classes c is drawn uniformly, then each of the
        K-1 partners is drawn uniformly, with replacement, among all images containing c (the
        anchor itself included, as in [CL]). All partners of an anchor share the same class c:
        the paper's candidate set S_i^k is "K samples that share the same class k". An anchor
        without any positive (impossible for noisy labels built by `noisymlt.data.noise`) gets
        partners drawn uniformly from the whole training set.
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise NoisyMLTError(f"stitch-up k: number of stitched images must be an integer >= 2, got {k!r}")
        anchors = np.asarray(anchor_indices, dtype=np.int64).reshape(-1)
        if anchors.size and (anchors.min() < 0 or anchors.max() >= self.num_images):
            raise IndexError(f"anchor index out of range [0, {self.num_images})")
        partners = np.empty((anchors.size, k - 1), dtype=np.int64)
        n_pos = self.row_counts[anchors]
        rows = np.flatnonzero(n_pos > 0)
        cls = self.row_classes[self.row_starts[anchors[rows]] + rng.integers(0, n_pos[rows])]
        offset = rng.integers(0, self.counts[cls][:, None], size=(rows.size, k - 1))
        partners[rows] = self.members[self.starts[cls][:, None] + offset]
        lonely = np.flatnonzero(n_pos == 0)
        if lonely.size:
            partners[lonely] = rng.integers(0, self.num_images, size=(lonely.size, k - 1))
        return partners


def apply_mask(p: float, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Which anchors of a batch get stitched: each independently with probability p."""
    try:
        prob = float(p)
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"stitch-up p: {p!r} is not a number") from exc
    if not 0.0 <= prob <= 1.0:  # also rejects NaN
        raise NoisyMLTError(f"stitch-up p: probability must lie in [0, 1], got {p!r}")
    return rng.random(batch_size) < prob  # random() is in [0, 1): p = 1 stitches all, p = 0 none


def _same_shapes(tensors: Sequence[torch.Tensor], what: str) -> None:
    if len(tensors) < 2:
        raise ValueError(f"{what}: need at least 2 tensors to stitch, got {len(tensors)}")
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"{what}: all tensors must have the same shape, got {sorted(shapes)}")


def stitch_features_average(feats: Sequence[torch.Tensor]) -> torch.Tensor:
    """Feature-average Stitch-Up (paper Eq. 4, the default): mean of the K (B, D) neck outputs."""
    _same_shapes(feats, "stitch_features_average")
    return torch.stack(list(feats), dim=0).mean(dim=0)


def stitch_feature_maps_concat(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Feature-concat Stitch-Up: K (B, C, H, W) maps side by side -> (B, C, H, K*W), before GAP,
    so global pooling afterwards sees every image's spatial cells."""
    _same_shapes(maps, "stitch_feature_maps_concat")
    return torch.cat(list(maps), dim=-1)


def stitch_images_concat(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Image-concat Stitch-Up: K (B, 3, H, W) images side by side -> (B, 3, H, K*W), no resize
    (lossless, which is the paper's point against Mix-Up; the backbone ends in global pooling)."""
    _same_shapes(images, "stitch_images_concat")
    return torch.cat(list(images), dim=-1)


def union_targets(targets: Sequence[torch.Tensor]) -> torch.Tensor:
    """Label Stitch-Up (paper Eq. 7): elementwise max of the K (B, C) label matrices."""
    _same_shapes(targets, "union_targets")
    out = targets[0]
    for t in targets[1:]:
        out = torch.maximum(out, t)
    return out


def stitchup_loss(
    elementwise_loss: ElementwiseLoss,
    stitched_logits: torch.Tensor,
    single_logits: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    *,
    mask: torch.Tensor | np.ndarray | None = None,
    negatives: str = "own",
) -> torch.Tensor:
    """Stitch-Up loss in the [CL] form; returns the mean over batch x classes (a scalar).

    With U = union of the K target rows:
    - entries with U = 1 take ``elementwise_loss(stitched_logits, U)`` (the stitched sample is
      supervised on the positives of the union);
    - entries with U = 0 take the mean over the K images of ``elementwise_loss(single_logits[k], T_k)``,
      i.e. every image is pushed down on the classes none of the K images claims.
    ``negatives`` picks T_k. "own" (default, what [CL] does and what produced the published numbers):
    T_k = targets[k], the image's own (corrected) labels. "union": T_k = U. The choice only
    matters for losses whose per-entry weight depends on the whole target row (DB's re-balancing
    weight r_ik uses the row's positives); at the selected entries both T_k are 0, and for BCE
    the two options are identical.
    ``mask`` (B,) bool: rows where it is False were not stitched and take the plain loss
    ``elementwise_loss(single_logits[0], targets[0])`` of the anchor (index 0) on every entry.
    """
    if negatives not in NEGATIVE_TARGETS:
        raise NoisyMLTError(f"stitch-up negatives: must be one of {NEGATIVE_TARGETS}, got {negatives!r}")
    if len(single_logits) != len(targets):
        raise ValueError(
            f"stitchup_loss: {len(single_logits)} single-image logits but {len(targets)} targets"
        )
    _same_shapes([stitched_logits, *single_logits, *targets], "stitchup_loss")
    union = union_targets(targets)
    stitched = elementwise_loss(stitched_logits, union)
    neg_targets = list(targets) if negatives == "own" else [union] * len(targets)
    singles = torch.stack([elementwise_loss(z, t) for z, t in zip(single_logits, neg_targets)], dim=0)
    per_entry = torch.where(union > 0, stitched, singles.mean(dim=0))
    if mask is not None:
        rows = torch.as_tensor(mask, dtype=torch.bool, device=per_entry.device).reshape(-1, 1)
        if rows.shape[0] != per_entry.shape[0]:
            raise ValueError(f"stitchup_loss: mask has {rows.shape[0]} rows, batch has {per_entry.shape[0]}")
        plain = elementwise_loss(single_logits[0], targets[0])
        per_entry = torch.where(rows, per_entry, plain)
    return per_entry.mean()


def mixup(
    images: torch.Tensor, targets: torch.Tensor, alpha: float, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, float, np.ndarray]:
    """Mix-Up (Zhang et al. 2018), the ablation baseline: one lambda ~ Beta(alpha, alpha) per
    batch, partner = a random permutation of the batch. Returns (mixed images, mixed targets,
    lambda, permutation); targets are mixed with the same lambda (soft labels in [0, 1])."""
    try:
        a = float(alpha)
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"mixup alpha: {alpha!r} is not a number") from exc
    if not a > 0.0:  # also rejects NaN
        raise NoisyMLTError(f"mixup alpha: Beta parameter must be > 0, got {alpha!r}")
    if images.shape[0] != targets.shape[0]:
        raise ValueError(f"mixup: {images.shape[0]} images but {targets.shape[0]} target rows")
    lam = float(rng.beta(a, a))
    perm = rng.permutation(images.shape[0])
    index = torch.as_tensor(perm, device=images.device)
    mixed_images = lam * images + (1.0 - lam) * images[index]
    mixed_targets = lam * targets + (1.0 - lam) * targets[index.to(targets.device)]
    return mixed_images, mixed_targets, lam, perm


@dataclass(frozen=True)
class NoiseLevel:
    """Label noise of a set of training targets measured against clean labels (per-class counts).

    A wrong positive is a target 1 whose clean label is 0; a wrong entry is any target that
    differs from its clean label (wrong positives plus missed positives).
    """

    wrong_positives: np.ndarray  # (C,)
    positives: np.ndarray  # (C,)
    wrong_entries: np.ndarray  # (C,)
    rows: int

    @property
    def positive_rate(self) -> float:
        """Fraction of positive targets that are wrong (the paper's "noise level"); NaN if none."""
        total = int(self.positives.sum())
        return float(self.wrong_positives.sum()) / total if total else float("nan")

    @property
    def entry_rate(self) -> float:
        """Fraction of all label entries that differ from the clean labels; NaN for no entries."""
        total = self.rows * self.positives.size
        return float(self.wrong_entries.sum()) / total if total else float("nan")

    def group_positive_rates(self, split: Mapping[str, Sequence[int]]) -> dict[str, float]:
        """positive_rate restricted to each class group (e.g. head/medium/tail of a class split)."""
        out = {}
        for group, classes in split.items():
            idx = np.asarray(list(classes), dtype=np.int64)
            total = int(self.positives[idx].sum())
            out[group] = float(self.wrong_positives[idx].sum()) / total if total else float("nan")
        return out


def noise_level(targets: np.ndarray, clean_targets: np.ndarray) -> NoiseLevel:
    """Measure how noisy ``targets`` are w.r.t. ``clean_targets`` (both (n, C), 0/1)."""
    T = _binary_matrix(targets, "noise level targets")
    Y = _binary_matrix(clean_targets, "noise level clean targets")
    if T.shape != Y.shape:
        raise ValueError(f"noise_level: targets {T.shape} and clean targets {Y.shape} differ in shape")
    return NoiseLevel(
        wrong_positives=(T & ~Y).sum(axis=0),
        positives=T.sum(axis=0),
        wrong_entries=(T != Y).sum(axis=0),
        rows=T.shape[0],
    )


def stitched_noise_level(
    noisy_Y: np.ndarray, clean_Y: np.ndarray, anchors: np.ndarray, partners: np.ndarray
) -> NoiseLevel:
    """Noise level of stitched samples (paper Fig. "noise level after Stitch-Up").

    Each stitched sample's target is the union of the noisy labels of its anchor and partners;
    its ground truth is the union of their clean labels (a class is present in the stitched
    input if any of its images contains it). Compare with ``noise_level(noisy_Y[anchors],
    clean_Y[anchors])`` for the same anchors without Stitch-Up.
    """
    noisy = _binary_matrix(noisy_Y, "noisy labels")
    clean = _binary_matrix(clean_Y, "clean labels")
    if noisy.shape != clean.shape:
        raise ValueError(f"stitched_noise_level: noisy {noisy.shape} and clean {clean.shape} differ in shape")
    anchors = np.asarray(anchors, dtype=np.int64).reshape(-1)
    partners = np.asarray(partners, dtype=np.int64).reshape(anchors.size, -1)
    group = np.concatenate([anchors[:, None], partners], axis=1)  # (B, K)
    return noise_level(noisy[group].any(axis=1), clean[group].any(axis=1))
