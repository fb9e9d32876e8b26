"""BBN's bilateral-branch network (Zhou et al., CVPR 2020), for multi-label outputs.

The conventional and the re-balancing branch share the backbone up to its last stage; each branch has
its own copy of that stage (initialised from the same, possibly pretrained, weights) followed by
global average pooling. One linear classifier reads 2 * [alpha f_c, (1 - alpha) f_r], i.e. the logits are
2 * (alpha W_c f_c + (1 - alpha) W_r f_r) + b, as BBN's code (``bbn_mix``) computes them. The factor 2 makes
the test-time input at alpha = 0.5 the plain concatenation [f_c, f_r], which is what BBN's code classifies.

alpha = 1 - (T / T_max)^2 follows BBN's paper; BBN's code divides by 100 * (T_max // 100 + 1) instead of
T_max when T_max is 90 or 180 (its ImageNet / iNaturalist schedules). The 8-epoch schedules here are
unaffected (tests/test_reference_baselines.py shows both).

``split_at``: ``stage`` (default, SPEC 4) duplicates the whole last residual stage (ResNet layer4);
``block`` duplicates only its last residual block, as BBN's released code does. The demo's SmallCNN
has one conv block per stage, so both mean its last conv block.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import ResNetTrunk, SmallCNN, apply_trainable, freeze_batchnorm
from noisymlt.models.choices import BBN_SPLITS as SPLITS
from noisymlt.models.heads import Head, global_average



def split_last_stage(backbone: nn.Module, split_at: str = "stage") -> tuple[nn.Module, nn.Module]:
    """(shared trunk, last stage) of a project backbone; the modules are reused, not copied."""
    if split_at not in SPLITS:
        raise NoisyMLTError(f"bbn split_at: unknown value {split_at!r}; choose one of {', '.join(SPLITS)}")
    if isinstance(backbone, ResNetTrunk):
        front = [backbone.stem, backbone.layer1, backbone.layer2, backbone.layer3]
        if split_at == "block":
            front.append(backbone.layer4[:-1])
            return nn.Sequential(*front), backbone.layer4[-1]
        return nn.Sequential(*front), backbone.layer4
    if isinstance(backbone, SmallCNN):
        body = backbone.body
        last = body[-3:]
        kinds = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU)
        if len(body) < 4 or not all(isinstance(m, k) for m, k in zip(last, kinds)):
            raise NoisyMLTError("bbn: SmallCNN no longer ends with a conv-BN-ReLU block; update models/bbn.py")
        return body[:-3], last
    raise NoisyMLTError(f"bbn: cannot split backbone {type(backbone).__name__} into trunk and last stage")


def bbn_alpha(epoch: int, total_epochs: int) -> float:
    """BBN's cumulative learning weight 1 - (T / T_max)^2 (T the 0-based epoch): from 1 (conventional
    branch only) down towards 0 (re-balancing branch)."""
    if total_epochs < 1 or not 0 <= epoch < total_epochs:
        raise NoisyMLTError(f"bbn: epoch {epoch} outside 0..{total_epochs - 1}")
    return 1.0 - (epoch / total_epochs) ** 2


class BBNNet(nn.Module):
    def __init__(self, backbone: nn.Module, num_classes: int, *, split_at: str = "stage", trainable: str = "all",
                 frozen_bn: bool = False):
        super().__init__()
        apply_trainable(backbone, trainable)
        self.shared, self.stage_c = split_last_stage(backbone, split_at)
        # the trunk whose stages these are, unregistered (its parameters are the ones above): noisymlt.training.trunkcache
        # finds the frozen stages through it
        self.source_trunks = (backbone,) if isinstance(backbone, ResNetTrunk) else ()
        self.stage_r = copy.deepcopy(self.stage_c)
        self.feat_dim = backbone.out_dim
        self.classifier = Head(2 * self.feat_dim, num_classes)
        self.frozen_bn = frozen_bn

    def train(self, mode: bool = True) -> "BBNNet":
        super().train(mode)
        if mode and self.frozen_bn:  # keep the pretrained statistics, as the other methods do
            freeze_batchnorm(self.shared, self.stage_c, self.stage_r)
        return self

    def branch_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAP features of both branches for the same images (one pass through the shared trunk)."""
        s = self.shared(x)
        return global_average(self.stage_c(s)), global_average(self.stage_r(s))

    def forward(self, x_c: torch.Tensor, x_r: torch.Tensor | None = None, alpha: float = 0.5) -> torch.Tensor:
        """Training: x_c from the uniform, x_r from the reversed sampler, alpha from ``bbn_alpha``.
        Test: one batch through both branches, alpha 0.5 (classifier input [f_c, f_r])."""
        if x_r is None:
            f_c, f_r = self.branch_features(x_c)
        else:  # separate trunk passes, so BatchNorm sees each sampler's batch on its own (as in BBN)
            f_c = global_average(self.stage_c(self.shared(x_c)))
            f_r = global_average(self.stage_r(self.shared(x_r)))
        return self.classifier(2.0 * torch.cat([alpha * f_c, (1.0 - alpha) * f_r], dim=1))
