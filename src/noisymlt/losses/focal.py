"""Focal loss (Lin et al. 2017) in multi-label BCE form."""

from __future__ import annotations

import torch

from noisymlt.losses.base import MultiLabelLoss, _bce, _focal_factor, loss_parameter

class FocalLoss(MultiLabelLoss):
    """alpha * (1 - pt)^gamma * BCE with pt = exp(-BCE); the paper's baseline uses gamma = alpha = 2."""

    def __init__(self, gamma: float = 2.0, alpha: float = 2.0) -> None:
        super().__init__()
        self.gamma = loss_parameter("gamma", gamma, low=0.0)
        self.alpha = loss_parameter("alpha", alpha, low=0.0, strict=True)

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        bce = _bce(z, y)
        return self.alpha * _focal_factor(bce, self.gamma) * bce


def _factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return FocalLoss(**p)


FACTORIES = {"focal": (_factory, FocalLoss, False)}
