"""The paper's model (SPEC 2; Liang et al. 2023, Sec. 4.1.1): class-dependent noise along co-occurrence.

Each clean positive i is kept with probability 1 - gamma; otherwise it is replaced by a class j != i drawn in
proportion to N[i, j], the number of clean training images holding both i and j, so labels move towards classes
that plausibly share a scene. A class that co-occurs with nothing is replaced uniformly. The random stream is the
one the project has always drawn (a uniform per positive, then one per replaced positive): its files keep their
bytes.
"""

from __future__ import annotations

import numpy as np

from noisymlt.data.noise_models.base import NoiseModel, register_noise_model, replaced_by_rows


def cooccurrence_counts(clean: np.ndarray) -> np.ndarray:
    """N: C x C counts of clean images holding both classes, diagonal 0. Counted by a float64 product (BLAS; an
    integer one is numpy's own loop, 20x slower on COCO's 118k images), exact below 2**53 images."""
    Y = np.asarray(clean, dtype=np.float64)
    N = np.rint(Y.T @ Y).astype(np.int64)
    np.fill_diagonal(N, 0)
    return N


def replacement_rows(N: np.ndarray) -> np.ndarray:
    """Row i = the distribution of the class replacing i: its co-occurrence row, or uniform over the others."""
    R = N.astype(np.float64)
    R[R.sum(axis=1) == 0] = 1.0
    np.fill_diagonal(R, 0.0)
    return R / R.sum(axis=1, keepdims=True)


@register_noise_model("cooccurrence")
class CoOccurrence(NoiseModel):
    label = "co-occurrence"

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return replaced_by_rows(replacement_rows(cooccurrence_counts(clean)), cols, gamma, rng)

    def transition(self, clean, gamma, prepared):
        R = replacement_rows(cooccurrence_counts(clean))
        T = np.zeros((R.shape[0], R.shape[0] + 1))
        T[:, :-1] = gamma * R
        np.fill_diagonal(T, 1.0 - gamma)
        return T
