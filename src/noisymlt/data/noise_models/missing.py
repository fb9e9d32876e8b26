"""Missing labels: each clean positive is lost with probability gamma, and nothing replaces it.

The partial-label setting of multi-label learning (Durand et al., "Learning a Deep ConvNet for Multi-label
Classification with Partial Labels", CVPR 2019; Cole et al., "Multi-Label Learning from Single Positive Labels",
CVPR 2021) read as noise: a lost positive is trained on as a negative. An image may lose every label; it stays in
the training set, all negative, as an unannotated image would.
"""

from __future__ import annotations

import numpy as np

from noisymlt.data.noise_models.base import DROP, KEEP, NoiseModel, flips, register_noise_model


@register_noise_model("missing")
class Missing(NoiseModel):
    label = "missing labels"
    keeps_every_image_labelled = False

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return np.where(flips(cols.size, gamma, rng), DROP, KEEP).astype(np.int64)

    def transition(self, clean, gamma, prepared):
        C = np.asarray(clean).shape[1]
        T = np.zeros((C, C + 1))
        T[np.arange(C), np.arange(C)] = 1.0 - gamma
        T[:, C] = gamma
        return T
