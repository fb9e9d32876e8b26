"""Neck and head of [CL]: GAP -> fc(D, 256) -> BatchNorm1d -> dropout, then fc(256, C)."""

from __future__ import annotations

import torch
from torch import nn


class Neck(nn.Module):
    def __init__(self, in_dim: int, out_dim: int = 256, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)
        self.bn = nn.BatchNorm1d(out_dim)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.fc.bias)

    def pool(self, maps: torch.Tensor) -> torch.Tensor:
        return maps.mean(dim=(2, 3))

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
