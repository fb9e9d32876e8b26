"""What every loss shares: the interface, parameter checks, and a float32-accurate BCE.

Every loss maps logits and float 0/1 targets of shape (B, C) to per-entry losses (``elementwise``,
needed by Stitch-Up, which supervises positives and negatives of one target row on different logits)
and to their mean over batch x classes (``forward``). Inputs are cast to float32 first, so the result
is float32 and the same under bf16 autocast. Class counts come from the (noisy) training labels; a
count of 0 is treated as 1 so that no loss divides by zero.
"""

from __future__ import annotations

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


def loss_parameter(name: str, value: object, *, low: float | None = None, strict: bool = False) -> float:
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

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The mean over batch x classes, or with ``keep`` (B, C) 0/1 over the entries it keeps (a cleaned table's
        labels left out of the loss: noisymlt.pipeline.cleaning)."""
        if keep is None:
            return self.elementwise(logits, targets).mean()
        return (self.elementwise(logits, targets) * keep).sum() / keep.sum().clamp(min=1.0)


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


