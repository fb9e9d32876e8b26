"""Uniform (symmetric) noise: a replaced positive goes to any class the image does not hold, all alike.

Each clean positive i of an image with clean label set P is kept with probability 1 - gamma; otherwise it is
replaced by a class drawn uniformly from the C - |P| classes outside P (an image holding every class keeps its
labels). The multi-label form of symmetric label noise (van Rooyen et al., NeurIPS 2015; Zhao & Gomes, "Evaluating
Multi-label Classifiers with Noisy Labels", 2021): the replacement ignores which class was there.
"""

from __future__ import annotations

import numpy as np

from noisymlt.data.noise_models.base import KEEP, NoiseModel, flips, register_noise_model


@register_noise_model("uniform")
class Uniform(NoiseModel):
    label = "uniform"

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        out = np.full(cols.size, KEEP, dtype=np.int64)
        flip = np.flatnonzero(flips(cols.size, gamma, rng))
        u = rng.random(flip.size)
        absent = clean[rows[flip]] == 0  # one row per replaced positive: the classes its image lacks
        count = absent.sum(axis=1)
        pick = np.minimum((u * count).astype(np.int64), np.maximum(count - 1, 0))  # the pick-th absent class
        target = (np.cumsum(absent, axis=1) <= pick[:, None]).sum(axis=1)
        out[flip] = np.where(count > 0, target, KEEP)
        return out

    def transition(self, clean, gamma, prepared):
        # averaged over the images: a positive of i in an image lacking A goes to each j in A w.p. gamma / |A|
        clean = np.asarray(clean).astype(np.float64)
        C = clean.shape[1]
        absent = 1.0 - clean
        count = absent.sum(axis=1)
        share = np.divide(absent, count[:, None], out=np.zeros_like(absent), where=count[:, None] > 0)
        T = np.zeros((C, C + 1))
        T[:, :C] = gamma * (clean.T @ share) / np.maximum(clean.sum(axis=0), 1)[:, None]
        kept = 1.0 - T[:, :C].sum(axis=1)
        T[np.arange(C), np.arange(C)] = kept
        return T
