"""Backbones: torchvision ResNets at paper scale, a tiny ResNet for the embedded demo dataset.

Every backbone maps images (B, 3, H, W) to feature maps (B, D, h, w) and exposes ``out_dim``;
the neck does global pooling, so feature-level Stitch-Up can work on maps or pooled vectors.

``resnet_tiny`` is the demo's stand-in for ResNet-50: the same stem / layer1-4 structure (one
torchvision BasicBlock per stage, widths 16-32-64-128, a 3x3 stride-1 stem for 32 px inputs), so
the demo goes through exactly the paper-scale code path: weights loaded from ``weights_path`` (the
toy analogue of ImageNet weights, made by ``noisymlt pretrain``), lower stages frozen, BN frozen.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from noisymlt.errors import NoisyMLTError, cause

log = logging.getLogger(__name__)

BACKBONES = ("resnet50", "resnet18", "resnet_tiny", "resnet_tiny_half", "smallcnn")
# ``trainable`` policies: ``all``, or the first stage that trains (it and every later stage do;
# the stem and earlier stages stay frozen). [CL]: layer4; [DB]'s frozen_stages=1: layer2.
STAGES = ("layer1", "layer2", "layer3", "layer4")
TRAINABLE = ("all", *STAGES[1:])
OUT_DIMS = {"resnet50": 2048, "resnet18": 512, "resnet_tiny": 128, "resnet_tiny_half": 64}
# resnet_tiny at half the widths (8-16-32-64): a [DB] step (layer2-4, batch 32, 32 px) 2.6x faster on one CPU thread
TINY_WIDTHS = {"resnet_tiny": (16, 32, 64, 128), "resnet_tiny_half": (8, 16, 32, 64)}


class TinyResNet(nn.Module):
    """A torchvision-style ResNet (conv1/bn1/relu/maxpool/layer1-4/fc) with one BasicBlock per stage
    and widths 16-32-64-128: about 0.7 M parameters, feature maps at 1/8 of the input side. The stem does
    not down-sample: a stride-2 stem runs six times faster on CPU but cost the demo's Ours 20 mAP points at
    gamma 0.5 (65.6 -> 45.8): at 32 px the glyphs are too small to lose half the resolution."""

    def __init__(self, num_classes: int = 1000, widths: tuple[int, ...] = (16, 32, 64, 128)):
        super().__init__()
        from torchvision.models.resnet import BasicBlock

        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()  # 32 px inputs: no early down-sampling

        def stage(cin: int, cout: int, stride: int) -> nn.Sequential:
            down = None
            if stride != 1 or cin != cout:
                down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            return nn.Sequential(BasicBlock(cin, cout, stride, down))

        self.layer1 = stage(widths[0], widths[0], 1)
        self.layer2 = stage(widths[0], widths[1], 2)
        self.layer3 = stage(widths[1], widths[2], 2)
        self.layer4 = stage(widths[2], widths[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():  # torchvision's ResNet initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


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
        """The stages from ``policy`` on ([CL]: layer4; [DB]: layer2); ``all``: the whole trunk."""
        if policy == "all":
            return [self]
        if policy not in STAGES:
            raise NoisyMLTError(f"train.trainable: unknown policy {policy!r}; choose one of {', '.join(TRAINABLE)}")
        return [getattr(self, name) for name in STAGES[STAGES.index(policy):]]

    def frozen_parts(self, policy: str) -> list[nn.Module]:
        """The stem and the stages before ``policy``, in order (empty for ``all``)."""
        if policy == "all":
            return []
        trained = self.trainable_parts(policy)
        return [m for m in (self.stem, self.layer1, self.layer2, self.layer3, self.layer4) if m not in trained]


class SmallCNN(nn.Module):
    """Four conv blocks trained from scratch (no stages): a quick backbone for unit tests."""

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
        return [self]  # trained from scratch: no stages to keep frozen


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
    """Build a backbone, with the weights of the local file ``weights_path`` if given (ImageNet weights: the
    run config names the asset file, noisymlt.data.assets). Nothing is downloaded here."""
    if name == "smallcnn":
        return SmallCNN()
    if name not in OUT_DIMS:
        raise NoisyMLTError(f"train.backbone: unknown backbone {name!r}; known: {', '.join(BACKBONES)}")
    import torchvision

    net = TinyResNet(widths=TINY_WIDTHS[name]) if name in TINY_WIDTHS else getattr(torchvision.models, name)(weights=None)
    if weights_path:
        path = Path(weights_path)
        if not path.is_file():
            raise NoisyMLTError(f"train.weights_path: {path} does not exist")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            # the source task's classifier is not part of the backbone (its size differs per task)
            state = {k: v for k, v in state.items() if not k.startswith("fc.")}
            missing, _ = net.load_state_dict(state, strict=False)
        except Exception as exc:  # unpickling errors, non-dict files, shape mismatches
            raise NoisyMLTError(f"train.weights_path: {path} is not a {name} state dict ({cause(exc)})") from exc
        if [k for k in missing if not k.startswith("fc.")]:
            raise NoisyMLTError(f"train.weights_path: {path} lacks backbone weights, e.g. {missing[:3]}")
        log.info("loaded backbone weights from %s", path)
    elif pretrained and name in TINY_WIDTHS:
        raise NoisyMLTError(f"train.pretrained: {name} has no published weights; set train.weights_path to the "
                            "file `noisymlt pretrain` writes, or train.pretrained: false")
    elif pretrained:
        # never downloaded here: a run names its ImageNet file (assets.imagenet, fetched before training)
        raise NoisyMLTError(
            f"train.pretrained: no ImageNet weights file for {name}; add assets.imagenet.{name} (url, sha256) to "
            "the params so the pipeline fetches it, set train.weights_path to a local state dict, or set "
            "train.pretrained: false (results will not match the paper)")
    return ResNetTrunk(net, OUT_DIMS[name])
