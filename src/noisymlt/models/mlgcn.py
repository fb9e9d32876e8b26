"""ML-GCN (Chen et al., CVPR 2019): a GCN over the label graph turns class embeddings into classifiers.

Two graph convolutions (embedding dim -> 1024 -> backbone feature dim, LeakyReLU 0.2 between) map the
C class embeddings to C classifiers; logits = GAP(image features) . classifiers^T. The graph is the
re-weighted conditional-probability matrix of the training labels (here the noisy ones), normalised
as ML-GCN's released ``gen_adj`` does.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import apply_trainable, freeze_batchnorm

HIDDEN_DIM = 1024


def label_adjacency(labels: np.ndarray, t: float = 0.4, p: float = 0.2) -> np.ndarray:
    """ML-GCN's re-weighted correlation matrix A' (C, C), before normalisation.

    P[i, j] = P(j | i) = #images with i and j / #images with i (0 for a class without positives);
    A[i, j] = 1 if P[i, j] >= t (i != j); A'[i, j] = p * A[i, j] / sum_k A[i, k] off the diagonal
    (rows without neighbours stay 0) and A'[i, i] = 1 - p.
    """
    if not 0 < t <= 1:
        raise NoisyMLTError(f"mlgcn: threshold t must be in (0, 1], got {t}")
    if not 0 <= p < 1:
        raise NoisyMLTError(f"mlgcn: re-weighting p must be in [0, 1), got {p}")
    y = np.asarray(labels, dtype=np.float64)
    if y.ndim != 2:
        raise NoisyMLTError(f"mlgcn: label matrix must be 2-D, got shape {y.shape}")
    co = y.T @ y
    n = np.diag(co)[:, None]
    cond = np.divide(co, n, out=np.zeros_like(co), where=n > 0)
    binary = (cond >= t).astype(np.float64)
    np.fill_diagonal(binary, 0.0)
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


class MLGCNNet(nn.Module):
    def __init__(self, backbone: nn.Module, gcn: LabelGCN, *, trainable: str = "all", frozen_bn: bool = False):
        super().__init__()
        apply_trainable(backbone, trainable)
        self.backbone = backbone
        self.gcn = gcn
        self.frozen_bn = frozen_bn

    def train(self, mode: bool = True) -> "MLGCNNet":
        super().train(mode)
        if mode and self.frozen_bn:
            freeze_batchnorm(self.backbone)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x).mean(dim=(2, 3))
        return feats @ self.gcn().t()
