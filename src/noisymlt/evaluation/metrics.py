"""Average precision per class (non-interpolated, as sklearn's average_precision_score) and mAP over
all / head / medium / tail classes. Computed with numpy: importing sklearn took longer than the
evaluation itself, once per evaluate job (the tests hold it equal to sklearn's)."""

from __future__ import annotations

import numpy as np

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError


def average_precision(y: np.ndarray, s: np.ndarray) -> float:
    """Non-interpolated AP of one class: sum over score thresholds of (recall step) x precision, tied
    scores forming one threshold (sklearn's step-wise precision-recall curve)."""
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order].astype(np.float64)
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # last index of each run of equal scores
    tps = np.cumsum(y)[last]
    precision = tps / (last + 1)
    recall_step = np.diff(np.r_[0.0, tps]) / tps[-1]
    return float(np.sum(recall_step * precision))


def average_precisions(y_true: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per-class AP; NaN for a class without positives in the test set (excluded from means)."""
    if y_true.shape != scores.shape:
        raise NoisyMLTError(f"scores shape {scores.shape} != labels shape {y_true.shape}")
    aps = np.full(y_true.shape[1], np.nan)
    for c in range(y_true.shape[1]):
        if y_true[:, c].any():
            aps[c] = average_precision(y_true[:, c], scores[:, c])
    return aps


def summarise(aps: np.ndarray, split: dict[str, list[int]]) -> dict[str, float]:
    out = {"total": float(np.nanmean(aps))}
    for g in GROUPS:
        vals = aps[split[g]] if split[g] else np.array([np.nan])
        out[g] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    return out
