"""One classification branch (backbone + neck + head) and the freezing policy of [CL]."""

from __future__ import annotations

import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import apply_trainable, build_backbone, freeze_batchnorm
from noisymlt.models.heads import HEADS, Neck


class Branch(nn.Module):
    def __init__(self, backbone: nn.Module, num_classes: int, *, neck_dim: int = 256, dropout: float = 0.0,
                 trainable: str = "all", frozen_bn: bool = False, head: str = "linear"):
        super().__init__()
        if head not in HEADS:
            raise NoisyMLTError(f"head: unknown classifier {head!r}; choose one of {', '.join(HEADS)}")
        self.backbone = backbone
        self.neck = Neck(backbone.out_dim, neck_dim, dropout)
        self.head = HEADS[head](neck_dim, num_classes)
        self.trainable = trainable
        self.frozen_bn = frozen_bn
        apply_trainable(self.backbone, trainable)

    def train(self, mode: bool = True) -> "Branch":
        super().train(mode)
        if mode and self.frozen_bn:
            freeze_batchnorm(self.backbone)
        return self

    def feature_maps(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    @property
    def splittable(self) -> bool:
        """Whether the backbone is a frozen prefix (BatchNorm frozen too) followed by trained stages."""
        return (self.frozen_bn and self.trainable != "all" and hasattr(self.backbone, "frozen_parts")
                and bool(self.backbone.frozen_parts(self.trainable)))

    def frozen_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen stages (stem, ..., the stage before the first trained one): no gradient."""
        with torch.no_grad():
            for part in self.backbone.frozen_parts(self.trainable):
                x = part(x)
        return x

    def trained_stages(self, h: torch.Tensor) -> torch.Tensor:
        """The rest of the backbone on the frozen prefix's output: feature_maps(x) = trained_stages(frozen_prefix(x))."""
        for part in self.backbone.trainable_parts(self.trainable):
            h = part(h)
        return h

    def embed(self, maps: torch.Tensor) -> torch.Tensor:
        return self.neck(maps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))


def build_branch(cfg: dict, num_classes: int, *, dropout: float | None = None, head: str = "linear") -> Branch:
    """``cfg`` is the resolved ``train`` block of params.yaml; the neck's dropout defaults to its
    ``neck_dropout`` ([DB]'s single-branch recipe: 0.5)."""
    backbone = build_backbone(cfg["backbone"], pretrained=cfg["pretrained"], weights_path=cfg.get("weights_path"))
    if dropout is None:
        dropout = float(cfg.get("neck_dropout", 0.0))
    return Branch(backbone, num_classes, neck_dim=cfg["neck_dim"], dropout=dropout,
                  trainable=cfg["trainable"], frozen_bn=cfg["frozen_bn"], head=head)
