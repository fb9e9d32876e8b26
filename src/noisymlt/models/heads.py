"""Neck and head of [CL]: GAP -> fc(D, 256) -> BatchNorm1d -> dropout, then fc(256, C)."""

from __future__ import annotations

import torch
from torch import nn


class _GlobalAverage(torch.autograd.Function):
    """``maps.mean(dim=(2, 3))`` whose gradient has the maps' memory format. Autograd's own backward expands the
    (B, D) gradient into a contiguous (NCHW) tensor; with channels_last maps the trunk's last ReLU then ran
    PyTorch's mixed-format kernel, 30x slower than the same-format one (1.2 ms against 34 us a call at
    (128, 128, 4, 4) on one CPU thread, 5% of an Ours run). The values are autograd's: grad / (h w) broadcast."""

    @staticmethod
    def forward(ctx, maps):
        ctx.shape = maps.shape
        ctx.channels_last = maps.dim() == 4 and not maps.is_contiguous() and maps.is_contiguous(
            memory_format=torch.channels_last)
        return maps.mean(dim=(2, 3))

    @staticmethod
    def backward(ctx, grad):
        n, c, h, w = ctx.shape
        out = (grad / (h * w))[:, :, None, None].expand(n, c, h, w)
        return out.contiguous(memory_format=torch.channels_last if ctx.channels_last else torch.contiguous_format)


def global_average(maps: torch.Tensor) -> torch.Tensor:
    """Global average pooling (B, D, h, w) -> (B, D), its gradient in the maps' memory format. Where no gradient is
    taken (prediction, export: tracing and export cannot see into an autograd Function) it is the plain mean, the
    same values."""
    if torch.is_grad_enabled() and maps.requires_grad:
        return _GlobalAverage.apply(maps)
    return maps.mean(dim=(2, 3))


class Neck(nn.Module):
    def __init__(self, in_dim: int, out_dim: int = 256, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)
        self.bn = nn.BatchNorm1d(out_dim)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.fc.bias)

    def pool(self, maps: torch.Tensor) -> torch.Tensor:
        return global_average(maps)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.fc(self.pool(maps))))


class Head(nn.Module):
    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(in_dim, num_classes)
        nn.init.normal_(self.fc.weight, 0.0, 0.01)
        nn.init.zeros_(self.fc.bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc(feats)


class CosineHead(nn.Module):
    """LDAM-DRW's NormedLinear: cosine similarities between the L2-normalised features and the
    L2-normalised class weights, in [-1, 1], no bias. LDAM's scale s = 30 multiplies them in the loss;
    on an ordinary linear head that scale would blow the logits up instead.
    The weight is laid out (in_dim, C) and initialised as LDAM-DRW does (uniform, columns renormed)."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_dim, num_classes))
        with torch.no_grad():
            self.weight.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(feats, dim=1) @ nn.functional.normalize(self.weight, dim=0)


HEADS = {"linear": Head, "cosine": CosineHead}

PRIOR_CLIP = 1e-3


def init_bias_at_prior(model: nn.Module, labels) -> int:
    """Set the bias of every linear ``Head`` in ``model`` to the logits of the class frequencies in ``labels``
    (N, C), clipped to [PRIOR_CLIP, 1 - PRIOR_CLIP]: the outputs start at the class priors, where a model that
    has not yet used the images belongs, instead of at 0.5 (train.head_bias_init: prior). Heads without a bias
    (LDAM's cosine head, ML-GCN's GCN classifiers) are left alone. Returns the number of heads set."""
    freq = torch.as_tensor(labels, dtype=torch.float64).mean(0).clamp(PRIOR_CLIP, 1 - PRIOR_CLIP)
    logits = torch.log(freq / (1 - freq))
    heads = [m for m in model.modules() if isinstance(m, Head)]
    with torch.no_grad():
        for head in heads:
            head.fc.bias.copy_(logits.to(head.fc.bias))
    return len(heads)
