"""ML-GCN (Chen et al., CVPR 2019): a GCN over the label graph turns class embeddings into classifiers.

Two graph convolutions (embedding dim -> 1024 -> backbone feature dim, LeakyReLU 0.2 between) map the
C class embeddings to C classifiers; logits = pooled image features . classifiers^T, with global
max-pooling as ML-GCN's code (``nn.MaxPool2d(14, 14)`` on its 14 x 14 maps) or average pooling.

The graph comes from the conditional probabilities P(j | i) of the training labels (here the noisy
ones), binarised at t, in one of two forms, then normalised as ML-GCN's ``gen_adj`` does:
- ``code`` (default): ML-GCN's released ``gen_A``: A * 0.25 / (column sums + 1e-6) + identity;
- ``paper``: the paper's Eq. 7 re-weighting, off-diagonal rows summing to p and diagonal 1 - p.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import apply_trainable, freeze_batchnorm
from noisymlt.models.choices import ADJACENCIES, POOLINGS
from noisymlt.models.heads import global_average

HIDDEN_DIM = 1024


CODE_SCALE = 0.25  # gen_A's constant


def binary_correlation(labels: np.ndarray, t: float) -> np.ndarray:
    """A[i, j] = 1 where P(j | i) = #images with i and j / #images with i is >= t (i != j), else 0.
    The diagonal is 0: ML-GCN's co-occurrence counts pair a class with the others only."""
    if not 0 < t <= 1:
        raise NoisyMLTError(f"mlgcn: threshold t must be in (0, 1], got {t}")
    y = np.asarray(labels, dtype=np.float64)
    if y.ndim != 2:
        raise NoisyMLTError(f"mlgcn: label matrix must be 2-D, got shape {y.shape}")
    co = y.T @ y
    n = np.diag(co)[:, None]
    cond = np.divide(co, n, out=np.zeros_like(co), where=n > 0)
    binary = (cond >= t).astype(np.float64)
    np.fill_diagonal(binary, 0.0)
    return binary


def code_adjacency(labels: np.ndarray, t: float = 0.4) -> np.ndarray:
    """ML-GCN's ``gen_A``: the binary correlation matrix scaled by 0.25 / (its column sums + 1e-6),
    plus the identity (C, C), before ``gen_adj``'s normalisation."""
    binary = binary_correlation(labels, t)
    return binary * CODE_SCALE / (binary.sum(0, keepdims=True) + 1e-6) + np.eye(binary.shape[0])


def label_adjacency(labels: np.ndarray, t: float = 0.4, p: float = 0.2) -> np.ndarray:
    """The paper's re-weighted correlation matrix A' (C, C), before normalisation: A'[i, j] =
    p * A[i, j] / sum_k A[i, k] off the diagonal (rows without neighbours stay 0), A'[i, i] = 1 - p."""
    if not 0 <= p < 1:
        raise NoisyMLTError(f"mlgcn: re-weighting p must be in [0, 1), got {p}")
    binary = binary_correlation(labels, t)
    rowsum = binary.sum(1, keepdims=True)
    reweighted = np.divide(p * binary, rowsum, out=np.zeros_like(binary), where=rowsum > 0)
    np.fill_diagonal(reweighted, 1.0 - p)
    return reweighted


def normalize_adjacency(a: np.ndarray) -> np.ndarray:
    """ML-GCN's ``gen_adj``: with D = diag(row sums of A)^(-1/2), returns D A^T D. The transpose is
    theirs: node i aggregates from j with weight ~ A[j, i]. Row sums are >= 1 - p > 0."""
    d = a.sum(1) ** -0.5
    return d[:, None] * a.T * d[None, :]


class GraphConv(nn.Module):
    """H' = A_hat H W, without bias (as ML-GCN); weights U(-1/sqrt(out), 1/sqrt(out))."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim))
        bound = 1.0 / math.sqrt(out_dim)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return adj @ (h @ self.weight)


class LabelGCN(nn.Module):
    """Class embeddings (C, E) -> classifiers (C, out_dim). Embeddings and graph are fixed buffers."""

    def __init__(self, embeddings: np.ndarray, adjacency: np.ndarray, out_dim: int, hidden: int = HIDDEN_DIM):
        super().__init__()
        emb = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
        adj = torch.as_tensor(np.asarray(adjacency), dtype=torch.float32)
        if emb.ndim != 2 or adj.shape != (emb.shape[0], emb.shape[0]):
            raise NoisyMLTError(f"mlgcn: embeddings {tuple(emb.shape)} and adjacency {tuple(adj.shape)} do not match")
        self.register_buffer("embeddings", emb)
        self.register_buffer("adjacency", adj)
        self.gc1 = GraphConv(emb.shape[1], hidden)
        self.gc2 = GraphConv(hidden, out_dim)
        self.act = nn.LeakyReLU(0.2)

    def forward(self) -> torch.Tensor:
        return self.gc2(self.act(self.gc1(self.embeddings, self.adjacency)), self.adjacency)


def build_adjacency(labels: np.ndarray, form: str, t: float, p: float) -> np.ndarray:
    """The normalised graph of ``form`` (``code`` or ``paper``) over the label matrix."""
    if form not in ADJACENCIES:
        raise NoisyMLTError(f"mlgcn adjacency: unknown form {form!r}; choose one of {', '.join(ADJACENCIES)}")
    raw = code_adjacency(labels, t) if form == "code" else label_adjacency(labels, t, p)
    return normalize_adjacency(raw)


class MLGCNNet(nn.Module):
    def __init__(self, backbone: nn.Module, gcn: LabelGCN, *, trainable: str = "all", frozen_bn: bool = False,
                 pool: str = "max"):
        super().__init__()
        if pool not in POOLINGS:
            raise NoisyMLTError(f"mlgcn pool: unknown pooling {pool!r}; choose one of {', '.join(POOLINGS)}")
        apply_trainable(backbone, trainable)
        self.backbone = backbone
        self.gcn = gcn
        self.frozen_bn = frozen_bn
        self.pool = pool

    def train(self, mode: bool = True) -> "MLGCNNet":
        super().train(mode)
        if mode and self.frozen_bn:
            freeze_batchnorm(self.backbone)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = self.backbone(x)
        feats = maps.amax(dim=(2, 3)) if self.pool == "max" else global_average(maps)
        return feats @ self.gcn().t()
