"""The two-branch network of the paper (random branch f, balanced branch g) and its variants.

Branches are held by name. [CL] gives every branch its own backbone (the default); the paper text
says both branches share one backbone, selectable with ``shared_backbone``. A model may also hold a
single branch (the single-branch Stitch-Up ablation). For feature-average Stitch-Up [CL] passes the
partner image through a second BatchNorm in the neck; ``partner_bn`` adds that layer per branch.
"""

from __future__ import annotations

import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import build_backbone
from noisymlt.models.branch import Branch


class TwoBranch(nn.Module):
    """Named branches (1 or 2) over separate or shared backbones, with optional partner BatchNorms."""

    def __init__(self, branches: dict[str, Branch], *, shared_backbone: bool = False, partner_bn: bool = False):
        super().__init__()
        if not 1 <= len(branches) <= 2:
            raise NoisyMLTError(f"a two-branch model holds 1 or 2 branches, got {len(branches)}")
        self.branches = nn.ModuleDict(branches)
        self.shared_backbone = shared_backbone
        if shared_backbone and len({id(b.backbone) for b in branches.values()}) != 1:
            raise ValueError("shared_backbone=True but the branches were built with different backbones")
        # A second BatchNorm per branch for the partner's neck output (feature-average Stitch-Up).
        self.partner_bns = nn.ModuleDict(
            {name: nn.BatchNorm1d(b.neck.bn.num_features) for name, b in branches.items()} if partner_bn else {}
        )
        self.shares_frozen_trunk = frozen_trunks_identical(list(branches.values()))

    @property
    def names(self) -> list[str]:
        return list(self.branches)

    def frozen_features(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen prefix that every branch shares (``shares_frozen_trunk``), run once for all of them."""
        if not self.shares_frozen_trunk:
            raise RuntimeError("the branches' frozen stages differ: no shared frozen trunk")
        return next(iter(self.branches.values())).frozen_prefix(x)

    def embed_partner(self, name: str, maps: torch.Tensor) -> torch.Tensor:
        """The neck of branch ``name`` (GAP -> fc -> BN -> dropout) with the partner BatchNorm."""
        neck = self.branches[name].neck
        return neck.drop(self.partner_bns[name](neck.fc(neck.pool(maps))))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits of every branch on the same images: the backbone runs once when shared, and the
        frozen trunk once when the branches' frozen stages are the same function."""
        out = {}
        shared_maps = None
        frozen = self.frozen_features(x) if self.shares_frozen_trunk and not self.shared_backbone else None
        for name, branch in self.branches.items():
            if self.shared_backbone:
                if shared_maps is None:
                    shared_maps = branch.feature_maps(x)
                maps = shared_maps
            elif frozen is not None:
                maps = branch.trained_stages(frozen)
            else:
                maps = branch.feature_maps(x)
            out[name] = branch.head(branch.embed(maps))
        return out


def frozen_trunks_identical(branches: list[Branch]) -> bool:
    """True when two branches' frozen prefixes are the same function: same frozen stages, BatchNorm frozen,
    equal weights and statistics (both loaded from the same pretrained file). Then [CL]'s stem + layer1-3,
    about 80% of ResNet-50's FLOPs, can run once per image for both branches and the peer's pass. Random
    initialisation (pretrained: false), ``trainable: all`` or training BatchNorm switch it off. A shared
    backbone needs no such check (one module)."""
    if len(branches) != 2 or any(not b.splittable for b in branches):
        return False
    a, b = branches
    if a.backbone is b.backbone:
        return False
    if a.trainable != b.trainable:
        return False
    parts_a, parts_b = a.backbone.frozen_parts(a.trainable), b.backbone.frozen_parts(b.trainable)
    state_a = [t for part in parts_a for t in part.state_dict().values()]
    state_b = [t for part in parts_b for t in part.state_dict().values()]
    return len(state_a) == len(state_b) and all(x.shape == y.shape and torch.equal(x, y)
                                                for x, y in zip(state_a, state_b))


def ensemble_logits(f: torch.Tensor, g: torch.Tensor, tau: float) -> torch.Tensor:
    """Test-time logits z = tau * f + (1 - tau) * g (paper Sec. 3.6; tau = 0.1)."""
    return tau * f + (1.0 - tau) * g


def build_two_branch(cfg: dict, num_classes: int, dropouts: dict[str, float], *, shared_backbone: bool = False,
                     partner_bn: bool = False) -> TwoBranch:
    """Branches named by ``dropouts`` (name -> neck dropout), in that order; ``cfg`` is the resolved
    ``train`` block of params.yaml (backbone, pretrained weights, neck size, freezing policy)."""

    def backbone() -> nn.Module:
        return build_backbone(cfg["backbone"], pretrained=cfg["pretrained"], weights_path=cfg.get("weights_path"))

    shared = backbone() if shared_backbone else None
    branches = {
        name: Branch(shared if shared is not None else backbone(), num_classes, neck_dim=cfg["neck_dim"],
                     dropout=float(p), trainable=cfg["trainable"], frozen_bn=cfg["frozen_bn"])
        for name, p in dropouts.items()
    }
    return TwoBranch(branches, shared_backbone=shared_backbone, partner_bn=partner_bn)
