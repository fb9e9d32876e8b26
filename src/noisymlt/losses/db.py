"""Distribution-Balanced loss (Wu et al. 2020), with and without its focal term."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.losses.base import MultiLabelLoss, _bce, _counts, _focal_factor, loss_parameter

class DistributionBalancedLoss(MultiLabelLoss):
    """Distribution-Balanced loss in the exact [DB]/[CL] form (paper Eq. 9-12).

    With n_k the class counts (clamped to >= 1), N the number of training images, lambda =
    ``neg_scale``, mu = ``map_mu``, and for one target row y_i:

    - re-balancing weight  r_ik = (1/n_k) / sum_{j: y_ij=1} 1/n_j, for every class k;
      w_ik = sigmoid(map_beta * (r_ik - mu)) + map_alpha on every entry. A row without positives
      has r = +inf (the limit [DB] reaches by dividing by 0), so w = 1 + map_alpha there.
    - logit regularisation  nu_k = kappa * log((N - n_k) / n_k) / lambda and z' = z - nu_k;
      N - n_k is clamped to >= 1, so a class present in every image stays finite.
    - negatives: z' <- lambda * z' and w <- w / lambda (positives unchanged).
    - loss_ik = w_ik * BCE(z'_ik, y_ik); with ``focal`` it is multiplied by
      focal_alpha * (1 - pt)^focal_gamma, pt = exp(-BCE(z'_ik, y_ik)) (unweighted BCE).

    The weights depend on the targets only and carry no gradient. Per-dataset values (VOC lambda 5,
    mu 0.3; COCO lambda 2, mu 0.2) are the caller's choice.
    """

    def __init__(
        self,
        class_counts: Sequence[float] | np.ndarray | torch.Tensor,
        num_images: int,
        *,
        focal: bool,
        neg_scale: float,
        map_mu: float,
        kappa: float = 0.05,
        map_beta: float = 10.0,
        map_alpha: float = 0.1,
        focal_gamma: float = 2.0,
        focal_alpha: float = 2.0,
    ) -> None:
        super().__init__()
        n = _counts(class_counts)
        big_n = loss_parameter("num_images", num_images, low=1.0)
        if big_n < n.max():
            raise NoisyMLTError(f"num_images ({num_images}) is smaller than the largest class count ({n.max():g})")
        self.num_classes = int(n.size)
        self.focal = bool(focal)
        self.neg_scale = loss_parameter("neg_scale", neg_scale, low=0.0, strict=True)
        self.map_mu = loss_parameter("map_mu", map_mu)
        self.kappa = loss_parameter("kappa", kappa, low=0.0)
        self.map_beta = loss_parameter("map_beta", map_beta, low=0.0)
        self.map_alpha = loss_parameter("map_alpha", map_alpha, low=0.0)
        self.focal_gamma = loss_parameter("focal_gamma", focal_gamma, low=0.0)
        self.focal_alpha = loss_parameter("focal_alpha", focal_alpha, low=0.0, strict=True)
        n_safe = np.maximum(n, 1.0)
        bias = self.kappa * np.log(np.maximum(big_n - n_safe, 1.0) / n_safe) / self.neg_scale
        self.register_buffer("freq_inv", torch.tensor(1.0 / n_safe, dtype=torch.float32), persistent=False)
        self.register_buffer("logit_bias", torch.tensor(bias, dtype=torch.float32), persistent=False)

    def weights(self, targets: torch.Tensor) -> torch.Tensor:
        """Re-balancing weights w_ik (before the 1/lambda on negatives), shape (B, C)."""
        y = targets.float()
        inv = self.freq_inv.to(y.device)
        repeat = (y * inv).sum(dim=1, keepdim=True)
        has_pos = repeat > 0
        r = inv / torch.where(has_pos, repeat, torch.ones_like(repeat))
        w = torch.sigmoid(self.map_beta * (r - self.map_mu)) + self.map_alpha
        return torch.where(has_pos, w, torch.full_like(w, 1.0 + self.map_alpha))

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        w = self.weights(y)
        z = z - self.logit_bias.to(z.device)
        # Linear in y (as [DB] writes it), so soft targets interpolate the two cases.
        z = z * (y + self.neg_scale * (1 - y))
        w = w * (y + (1 - y) / self.neg_scale)
        bce = _bce(z, y)
        loss = w * bce
        if self.focal:
            loss = self.focal_alpha * _focal_factor(bce, self.focal_gamma) * loss
        return loss


def _db_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return DistributionBalancedLoss(class_counts, num_images, focal=False, **p)


def _db_focal_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return DistributionBalancedLoss(class_counts, num_images, focal=True, **p)


FACTORIES = {
    "db": (_db_factory, DistributionBalancedLoss, True),
    "db_focal": (_db_focal_factory, DistributionBalancedLoss, True),
}
