"""Backbones: torchvision ResNets at paper scale, a small CNN for the embedded demo dataset.

Every backbone maps images (B, 3, H, W) to feature maps (B, D, h, w) and exposes ``out_dim``;
the neck does global pooling, so feature-level Stitch-Up can work on maps or pooled vectors.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)

BACKBONES = ("resnet50", "resnet18", "smallcnn")


class ResNetTrunk(nn.Module):
    """A torchvision ResNet without its pooling and classifier."""

    def __init__(self, net: nn.Module, out_dim: int):
        super().__init__()
        self.stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def trainable_parts(self, policy: str) -> list[nn.Module]:
        """[CL] trains only layer4 (plus neck and head); ``all`` fine-tunes the whole trunk."""
        if policy == "layer4":
            return [self.layer4]
        return [self]


class SmallCNN(nn.Module):
    """Four conv blocks; learns the embedded 64 px dataset in seconds on a CPU."""

    def __init__(self, width: int = 32):
        super().__init__()
        chans = [3, width, width * 2, width * 4, width * 8]
        blocks = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            blocks.append(nn.MaxPool2d(2))
        self.body = nn.Sequential(*blocks[:-1])  # keep the last map at 1/8 resolution
        self.out_dim = chans[-1]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def trainable_parts(self, policy: str) -> list[nn.Module]:
        return [self]  # nothing pretrained to keep


def apply_trainable(backbone: nn.Module, policy: str) -> None:
    """``all`` trains everything; otherwise only the backbone's ``trainable_parts(policy)`` (ResNet:
    layer4) keep gradients ([CL] trains layer4 + neck + head)."""
    if policy == "all":
        return
    for p in backbone.parameters():
        p.requires_grad_(False)
    for part in backbone.trainable_parts(policy):
        for p in part.parameters():
            p.requires_grad_(True)


def freeze_batchnorm(*modules: nn.Module) -> None:
    """Put every BatchNorm layer of ``modules`` in eval mode: [CL] keeps the pretrained backbone
    statistics. Call it from a model's ``train()`` after ``super().train(mode)``."""
    for module in modules:
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()


def build_backbone(name: str, *, pretrained: bool = False, weights_path: str | None = None) -> nn.Module:
    """Build a backbone. ImageNet weights come from torchvision's download (cached in TORCH_HOME)
    or from a local file; offline users set ``pretrained: false`` or ``weights_path``."""
    if name == "smallcnn":
        return SmallCNN()
    if name not in ("resnet50", "resnet18"):
        raise NoisyMLTError(f"train.backbone: unknown backbone {name!r}; known: {', '.join(BACKBONES)}")
    import torchvision

    ctor = getattr(torchvision.models, name)
    net = ctor(weights=None)
    if weights_path:
        path = Path(weights_path)
        if not path.is_file():
            raise NoisyMLTError(f"train.weights_path: {path} does not exist")
        state = torch.load(path, map_location="cpu", weights_only=True)
        missing, unexpected = net.load_state_dict(state, strict=False)
        if [k for k in missing if not k.startswith("fc.")]:
            raise NoisyMLTError(f"train.weights_path: {path} lacks backbone weights, e.g. {missing[:3]}")
        log.info("loaded backbone weights from %s", path)
    elif pretrained:
        weights = {"resnet50": "IMAGENET1K_V1", "resnet18": "IMAGENET1K_V1"}[name]
        try:
            net = ctor(weights=weights)
        except Exception as exc:  # URLError, SSL errors, hash mismatch...
            raise NoisyMLTError(
                f"train.pretrained: cannot download torchvision {name} ImageNet weights ({exc}). "
                "Offline? Put the file in TORCH_HOME's hub/checkpoints, set train.weights_path to a local "
                "state dict, or set train.pretrained: false (results will not match the paper)."
            ) from exc
    out_dim = {"resnet50": 2048, "resnet18": 512}[name]
    return ResNetTrunk(net, out_dim)
