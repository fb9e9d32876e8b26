"""LDAM (Cao et al. 2019) in multi-label BCE form."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from noisymlt.losses.base import MultiLabelLoss, _bce, _counts, loss_parameter

class LDAMLoss(MultiLabelLoss):
    """LDAM in multi-label BCE form: BCE(scale * (z - m_k * y), y).

    m_k is proportional to n_k^(-1/4) (counts clamped to >= 1), normalised so the largest margin is
    ``max_margin``; it is subtracted from positive logits only.
    """

    def __init__(
        self,
        class_counts: Sequence[float] | np.ndarray | torch.Tensor,
        max_margin: float = 0.5,
        scale: float = 30.0,
    ) -> None:
        super().__init__()
        n = np.maximum(_counts(class_counts), 1.0)
        self.num_classes = int(n.size)
        self.max_margin = loss_parameter("max_margin", max_margin, low=0.0, strict=True)
        self.scale = loss_parameter("scale", scale, low=0.0, strict=True)
        m = n ** -0.25
        m = m * (self.max_margin / m.max())
        self.register_buffer("margins", torch.tensor(m, dtype=torch.float32), persistent=False)

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        z = self.scale * (z - self.margins.to(z.device) * y)
        return _bce(z, y)


def _factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return LDAMLoss(class_counts, **p)


FACTORIES = {"ldam": (_factory, LDAMLoss, True)}
