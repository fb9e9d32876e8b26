"""[CL]'s network as its code lays it out, for the tests that convert and evaluate its checkpoints.

[CL]'s code (mmcv 1.3, torch 1.4) cannot run here, so this module rebuilds the parts of its StitchUpClassifier that
inference uses, with its module names: mmcv's ResNet-50 (mllt/models/backbones/resnet.py: stem conv1/bn1, stages
layer1-4 of Bottlenecks conv1-3/bn1-3/downsample, stride in the 3x3 conv, all four stage outputs returned), the PFC
neck (mllt/models/necks/pfc.py: fc, bn, bn2, fc_hidden_1; global average pool -> fc -> bn -> dropout on the last
stage), the ClsHead (fc_cls) and the classifier's two branches (backbone/neck/head, backbone1/neck1/head1) with
its test-time mix 0.1 * random + 0.9 * balanced; and mmcv's ResNet-18 (BasicBlocks), same key layout, a fraction of
the time. Weights are made random (``randomise``) and saved the way mmcv saves a checkpoint (``mmcv_checkpoint``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------ [CL]'s network, as its code lays it out
class MMBottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)  # style='pytorch'
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class MMBasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))



class MMResNet(nn.Module):
    """mmcv's ResNet: the stem, stages layer1-4 of ``block`` (``blocks`` of them a stage, the stride in the first),
    all four stage outputs returned (out_indices=(0, 1, 2, 3))."""

    def __init__(self, block: type, blocks: tuple[int, int, int, int]):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for i, (count, stride) in enumerate(zip(blocks, (1, 2, 2, 2))):
            planes = 64 * 2 ** i
            layer = [block(inplanes, planes, stride)]
            layer += [block(planes * block.expansion, planes, 1) for _ in range(count - 1)]
            inplanes = planes * block.expansion
            self.add_module(f"layer{i + 1}", nn.Sequential(*layer))

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        outs = []
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
            outs.append(x)
        return tuple(outs)


class MMResNet50(MMResNet):
    def __init__(self):
        super().__init__(MMBottleneck, (3, 4, 6, 3))


class MMResNet18(MMResNet):
    def __init__(self):
        super().__init__(MMBasicBlock, (2, 2, 2, 2))


class PFC(nn.Module):
    def __init__(self, dropout: float, in_channels: int = 2048):  # the last stage's channels: 512 for a ResNet-18
        super().__init__()
        self.fc = nn.Linear(in_channels, 256)
        self.bn = nn.BatchNorm1d(256)
        self.bn2 = nn.BatchNorm1d(256)
        self.fc_hidden_1 = nn.Linear(256, 256)  # only with layers=2, which [CL] never sets
        self.drop = nn.Dropout(dropout)

    def forward(self, x, partner: bool = False):
        x = x[-1]
        x = F.avg_pool2d(x, x.size()[2:]).view(x.size(0), -1)
        return self.drop((self.bn2 if partner else self.bn)(self.fc(x)))


class ClsHead(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.fc_cls = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.fc_cls(x.view(x.size(0), -1))


class StitchUpClassifier(nn.Module):
    def __init__(self, num_classes: int = 20, backbone: type = None, in_channels: int = 2048):
        super().__init__()
        backbone = backbone or MMResNet50
        self.backbone, self.backbone1 = backbone(), backbone()
        self.neck, self.neck1 = PFC(0.0, in_channels), PFC(0.5, in_channels)
        self.head, self.head1 = ClsHead(num_classes), ClsHead(num_classes)

    def simple_test(self, img):
        random = self.head(self.neck(self.backbone(img)))
        balance = self.head1(self.neck1(self.backbone1(img)))
        return 0.1 * random + 0.9 * balance, random, balance


def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every weight and BatchNorm statistic random, so a tensor loaded into the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                t.fill_(int(torch.randint(1, 1000, (1,), generator=g)))
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
            elif name.endswith("running_mean") or (name.endswith("bias")):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif t.dim() == 1:  # BatchNorm scales
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.5)
            else:
                fan_in = t[0].numel()
                t.copy_(torch.randn(t.shape, generator=g) * (2.0 / fan_in) ** 0.5)
    return model.eval()


def mmcv_checkpoint(model: nn.Module, path, *, legacy: bool = False, prefix: str = "") -> None:
    """As mmcv 1.3's save_checkpoint writes it: meta, a CPU state dict of the unwrapped model, the optimizer."""
    state = OrderedDict((prefix + k, v.detach().cpu()) for k, v in model.state_dict().items())
    opt = torch.optim.SGD([p for p in model.parameters()][:2], lr=0.02, momentum=0.9)
    torch.save({"meta": {"mmcv_version": "1.3.12", "time": time.asctime(), "epoch": 8, "iter": 296},
                "state_dict": state, "optimizer": opt.state_dict()}, path,
               _use_new_zipfile_serialization=not legacy)


def stitchup_classifier18(num_classes: int) -> nn.Module:
    """[CL]'s StitchUpClassifier on ResNet-18 backbones: its PFC necks take the last stage's 512 channels."""
    return StitchUpClassifier(num_classes, backbone=MMResNet18, in_channels=512)
