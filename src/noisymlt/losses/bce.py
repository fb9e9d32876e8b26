"""Binary cross-entropy (paper Eq. 8)."""

from __future__ import annotations

import torch

from noisymlt.losses.base import MultiLabelLoss, _bce

class BCELoss(MultiLabelLoss):
    """Binary cross-entropy on every entry (paper Eq. 8)."""

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        return _bce(z, y)


def _factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return BCELoss(**p)


# name -> (factory, the class whose keyword parameters the name accepts, whether it needs counts)
FACTORIES = {"bce": (_factory, BCELoss, False)}
