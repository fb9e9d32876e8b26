"""A linear probe of a pretrained trunk: does fine-tuning improve on the frozen features?

With ImageNet features on VOC, fine-tuning adds several points of mAP over a linear classifier on the frozen,
pooled features; a stand-in's pretrained trunk plays ImageNet's role only if the same holds there. The probe:
the frozen trunk's globally pooled features of every image (test transform), standardised on the training
images, and one ridge regression per class onto its 0/1 labels, the ridge strength chosen by k-fold
cross-validated mAP on the training images alone (the test set is scored once, at the chosen strength).
"""

from __future__ import annotations

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.metrics import average_precisions

RIDGE_STRENGTHS = tuple(10.0 ** k for k in range(-5, 4))  # x the number of training images, on standardised features


def pooled_features(backbone, batches) -> np.ndarray:
    """(N, D) globally average-pooled feature maps of ``backbone`` over ``batches`` of images, in eval mode."""
    import torch

    backbone.eval()
    out = []
    with torch.no_grad():
        for images in batches:
            out.append(backbone(images).float().mean(dim=(2, 3)).cpu().numpy())
    return np.concatenate(out).astype(np.float64)


def _ridge(x: np.ndarray, y: np.ndarray, strength: float) -> tuple[np.ndarray, np.ndarray]:
    """Weights (D, C) and bias (C,) minimising |x w + b - y|^2 + strength * N * |w|^2 (x centred inside)."""
    mean_x, mean_y = x.mean(axis=0), y.mean(axis=0)
    xc = x - mean_x
    gram = xc.T @ xc + strength * x.shape[0] * np.eye(x.shape[1])
    w = np.linalg.solve(gram, xc.T @ (y - mean_y))
    return w, mean_y - mean_x @ w


def _map(y: np.ndarray, scores: np.ndarray) -> float:
    return float(np.nanmean(average_precisions(y, scores)))


def ridge_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, *, folds: int = 5, seed: int = 0,
                strengths: tuple[float, ...] = RIDGE_STRENGTHS) -> dict:
    """Test scores (N_test, C) of the ridge probe and how its strength was chosen (cross-validated mAP per
    strength on the training images)."""
    train_x, test_x = np.asarray(train_x, np.float64), np.asarray(test_x, np.float64)
    train_y = np.asarray(train_y, np.float64)
    if train_x.shape[0] != train_y.shape[0] or train_x.shape[0] < folds:
        raise NoisyMLTError(f"probe: {train_x.shape[0]} feature rows for {train_y.shape[0]} label rows "
                            f"({folds} folds need at least {folds} images)")
    mu, sd = train_x.mean(axis=0), train_x.std(axis=0) + 1e-8
    train_x, test_x = (train_x - mu) / sd, (test_x - mu) / sd
    fold_of = np.random.default_rng(seed).permutation(train_x.shape[0]) % folds
    cv = {}
    for strength in strengths:
        scores = np.empty_like(train_y)
        for k in range(folds):
            held = fold_of == k
            w, b = _ridge(train_x[~held], train_y[~held], strength)
            scores[held] = train_x[held] @ w + b
        cv[strength] = _map(train_y, scores)  # pooled over folds: every training image scored once, held out
    best = max(strengths, key=lambda s: (cv[s], -s))
    w, b = _ridge(train_x, train_y, best)
    return {"test_scores": test_x @ w + b, "strength": best, "cv_map": {f"{s:g}": round(100 * v, 2)
                                                                         for s, v in cv.items()}}


def probe_record(trunk, train_batches, test_batches, train_labels: np.ndarray, test_labels: np.ndarray,
                 seed: int) -> dict:
    """The probe of ``trunk`` (a pretrained backbone, frozen) fit on ``train_labels`` and scored on the test set:
    its test mAP (a fraction: the mean of the classes' APs, as a run's total mAP), the ridge strength cross-validation
    chose (folds drawn with ``seed``), and the participation ratio of the pooled features' spectrum (how many
    directions the trunk's features use)."""
    train_x = pooled_features(trunk, train_batches)
    test_x = pooled_features(trunk, test_batches)
    probe = ridge_probe(train_x, train_labels, test_x, seed=seed)
    spectrum = np.clip(np.linalg.eigvalsh(np.cov(train_x, rowvar=False)), 0.0, None)
    return {"probe_map": round(_map(np.asarray(test_labels) > 0.5, probe["test_scores"]), 6),
            "probe_strength": probe["strength"],
            "probe_participation_ratio": round(float(spectrum.sum() ** 2 / (spectrum ** 2).sum()), 4)}
