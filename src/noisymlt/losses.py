"""Multi-label losses of the paper and its baselines (SPEC sections 3 and 4).

Every loss maps logits and float 0/1 targets of shape (B, C) to per-entry losses
(``elementwise``, needed by Stitch-Up, which supervises positives and negatives of one target row
on different logits) and to their mean over batch x classes (``forward``). Inputs are cast to
float32 first, so the result is float32 and the same under bf16 autocast. Class counts come from
the (noisy) training labels; a count of 0 is treated as 1 so that no loss divides by zero.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from noisymlt.errors import NoisyMLTError

# Below this the focal factor (1 - pt) is clamped: pow(0, gamma) with 0 < gamma < 1 has an
# infinite derivative, which turns a saturated logit into a NaN gradient.
_FOCAL_FLOOR = 1e-12


def _number(name: str, value: object, *, low: float | None = None, strict: bool = False) -> float:
    """A finite real loss parameter, >= low (or > low when strict)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise NoisyMLTError(f"loss parameter '{name}' must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise NoisyMLTError(f"loss parameter '{name}' must be finite, got {value!r}")
    if low is not None and (x <= low if strict else x < low):
        raise NoisyMLTError(f"loss parameter '{name}' must be {'>' if strict else '>='} {low}, got {value!r}")
    return x


def _counts(class_counts: Sequence[float] | np.ndarray | torch.Tensor) -> np.ndarray:
    """Per-class positive counts as a float64 vector (validated, not yet clamped)."""
    if isinstance(class_counts, torch.Tensor):
        class_counts = class_counts.detach().cpu().numpy()
    try:
        n = np.asarray(class_counts, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"class_counts must be a vector of numbers: {exc}") from exc
    if n.ndim != 1 or n.size == 0:
        raise NoisyMLTError(f"class_counts must be a non-empty 1-D vector, got shape {n.shape}")
    if not np.all(np.isfinite(n)) or np.any(n < 0):
        raise NoisyMLTError(f"class_counts must be finite and >= 0, got {n.tolist()}")
    return n


class MultiLabelLoss(nn.Module):
    """Base: ``forward`` is the mean of ``elementwise`` over batch x classes."""

    num_classes: int | None = None

    def _prepare(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.ndim != 2 or logits.shape != targets.shape:
            raise NoisyMLTError(
                f"{type(self).__name__}: logits {tuple(logits.shape)} and targets "
                f"{tuple(targets.shape)} must both be (batch, classes)"
            )
        if self.num_classes is not None and logits.shape[1] != self.num_classes:
            raise NoisyMLTError(
                f"{type(self).__name__}: built for {self.num_classes} classes, got logits with {logits.shape[1]}"
            )
        return logits.float(), targets.to(device=logits.device, dtype=torch.float32)

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.elementwise(logits, targets).mean()


def _bce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """BCE with logits as y * softplus(-z) + (1 - y) * softplus(z).

    Same value and gradient (sigmoid(z) - y) as ``F.binary_cross_entropy_with_logits``, but that
    one computes log(1 + exp(-|z|)) without log1p, which in float32 loses ~1e-3 relative accuracy
    on the small losses of lambda-scaled DB negatives and of confident entries.
    """
    return y * F.softplus(-z) + (1 - y) * F.softplus(z)


def _focal_factor(bce: torch.Tensor, gamma: float) -> torch.Tensor:
    """(1 - pt)^gamma with pt = exp(-bce); expm1 keeps 1 - pt accurate when pt is near 1."""
    return (-torch.expm1(-bce)).clamp_min(_FOCAL_FLOOR).pow(gamma)


class BCELoss(MultiLabelLoss):
    """Binary cross-entropy on every entry (paper Eq. 8)."""

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        return _bce(z, y)


class FocalLoss(MultiLabelLoss):
    """alpha * (1 - pt)^gamma * BCE with pt = exp(-BCE); the paper's baseline uses gamma = alpha = 2."""

    def __init__(self, gamma: float = 2.0, alpha: float = 2.0) -> None:
        super().__init__()
        self.gamma = _number("gamma", gamma, low=0.0)
        self.alpha = _number("alpha", alpha, low=0.0, strict=True)

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        bce = _bce(z, y)
        return self.alpha * _focal_factor(bce, self.gamma) * bce


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
        big_n = _number("num_images", num_images, low=1.0)
        if big_n < n.max():
            raise NoisyMLTError(f"num_images ({num_images}) is smaller than the largest class count ({n.max():g})")
        self.num_classes = int(n.size)
        self.focal = bool(focal)
        self.neg_scale = _number("neg_scale", neg_scale, low=0.0, strict=True)
        self.map_mu = _number("map_mu", map_mu)
        self.kappa = _number("kappa", kappa, low=0.0)
        self.map_beta = _number("map_beta", map_beta, low=0.0)
        self.map_alpha = _number("map_alpha", map_alpha, low=0.0)
        self.focal_gamma = _number("focal_gamma", focal_gamma, low=0.0)
        self.focal_alpha = _number("focal_alpha", focal_alpha, low=0.0, strict=True)
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
        self.max_margin = _number("max_margin", max_margin, low=0.0, strict=True)
        self.scale = _number("scale", scale, low=0.0, strict=True)
        m = n ** -0.25
        m = m * (self.max_margin / m.max())
        self.register_buffer("margins", torch.tensor(m, dtype=torch.float32), persistent=False)

    def elementwise(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, y = self._prepare(logits, targets)
        z = self.scale * (z - self.margins.to(z.device) * y)
        return _bce(z, y)


def _bce_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return BCELoss(**p)


def _focal_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return FocalLoss(**p)


def _db_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return DistributionBalancedLoss(class_counts, num_images, focal=False, **p)


def _db_focal_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return DistributionBalancedLoss(class_counts, num_images, focal=True, **p)


def _ldam_factory(class_counts, num_images, **p) -> MultiLabelLoss:
    return LDAMLoss(class_counts, **p)


# name -> (factory, the class whose keyword parameters the name accepts, whether it needs counts)
LOSSES = {
    "bce": (_bce_factory, BCELoss, False),
    "focal": (_focal_factory, FocalLoss, False),
    "db": (_db_factory, DistributionBalancedLoss, True),
    "db_focal": (_db_focal_factory, DistributionBalancedLoss, True),
    "ldam": (_ldam_factory, LDAMLoss, True),
}
_FIXED = {"class_counts", "num_images", "focal"}  # set by build_loss / the name, never by params


def build_loss(
    name: str,
    class_counts: Sequence[float] | np.ndarray | torch.Tensor | None = None,
    num_images: int | None = None,
    **params: float,
) -> MultiLabelLoss:
    """The loss called ``name`` (one of LOSSES), built from the training class counts and size.

    ``params`` are the keyword parameters of the loss class (e.g. ``neg_scale``, ``map_mu`` for
    db/db_focal; ``gamma``, ``alpha`` for focal); unknown, missing or out-of-range ones are refused.
    """
    if name not in LOSSES:
        raise NoisyMLTError(f"unknown loss '{name}'; known losses: {', '.join(sorted(LOSSES))}")
    factory, cls, needs_counts = LOSSES[name]
    sig = inspect.signature(cls.__init__).parameters
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    allowed = {k for k, p in sig.items() if p.kind in keyword and k != "self"} - _FIXED
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise NoisyMLTError(
            f"loss '{name}': unknown parameter(s) {unknown}; accepted: {sorted(allowed) or 'none'}"
        )
    missing = sorted(k for k in allowed if sig[k].default is inspect.Parameter.empty and k not in params)
    if missing:
        raise NoisyMLTError(f"loss '{name}': missing required parameter(s) {missing}")
    if needs_counts and class_counts is None:
        raise NoisyMLTError(f"loss '{name}' needs the class counts of the training labels")
    if "num_images" in sig and num_images is None:
        raise NoisyMLTError(f"loss '{name}' needs the number of training images")
    return factory(class_counts, num_images, **params)
