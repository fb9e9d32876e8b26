"""A checkpoint of [CL]'s code converted into our two-branch model gives [CL]'s outputs.

[CL]'s code (mmcv 1.3, torch 1.4) cannot run here, so this file rebuilds the parts of its StitchUpClassifier that
inference uses, with its module names: mmcv's ResNet-50 (mllt/models/backbones/resnet.py: stem conv1/bn1, stages
layer1-4 of Bottlenecks conv1-3/bn1-3/downsample, stride in the 3x3 conv, all four stage outputs returned), the PFC
neck (mllt/models/necks/pfc.py: fc, bn, bn2, fc_hidden_1; global average pool -> fc -> bn -> dropout on the last
stage), the ClsHead (fc_cls) and the classifier's two branches (backbone/neck/head, backbone1/neck1/head1) with
its test-time mix 0.1 * random + 0.9 * balanced. Its random weights and BatchNorm statistics are saved the way mmcv
saves a checkpoint, converted, and the logits compared.
"""

from __future__ import annotations

import copy
import os
import time
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from noisymlt.cli import main
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.options import BRANCH_NAMES
from noisymlt.models.cl_checkpoint import (CL_BRANCHES, build_from_cl, convert_state_dict, infer_architecture,
                                           read_cl_checkpoint)
from noisymlt.models.twobranch import ensemble_logits


# ------------------------------------------------------------------ [CL]'s network, as its code lays it out
class _MMBottleneck(nn.Module):
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


class _MMResNet50(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for i, (blocks, stride) in enumerate(zip((3, 4, 6, 3), (1, 2, 2, 2))):
            planes = 64 * 2 ** i
            layer = [_MMBottleneck(inplanes, planes, stride)]
            layer += [_MMBottleneck(planes * 4, planes, 1) for _ in range(blocks - 1)]
            inplanes = planes * 4
            self.add_module(f"layer{i + 1}", nn.Sequential(*layer))

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        outs = []
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
            outs.append(x)
        return tuple(outs)  # out_indices=(0, 1, 2, 3)


class _PFC(nn.Module):
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


class _ClsHead(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.fc_cls = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.fc_cls(x.view(x.size(0), -1))


class _StitchUpClassifier(nn.Module):
    def __init__(self, num_classes: int = 20, backbone: type = None, in_channels: int = 2048):
        super().__init__()
        backbone = backbone or _MMResNet50
        self.backbone, self.backbone1 = backbone(), backbone()
        self.neck, self.neck1 = _PFC(0.0, in_channels), _PFC(0.5, in_channels)
        self.head, self.head1 = _ClsHead(num_classes), _ClsHead(num_classes)

    def simple_test(self, img):
        random = self.head(self.neck(self.backbone(img)))
        balance = self.head1(self.neck1(self.backbone1(img)))
        return 0.1 * random + 0.9 * balance, random, balance


def _randomise(model: nn.Module, seed: int) -> nn.Module:
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


def _mmcv_checkpoint(model: nn.Module, path, *, legacy: bool = False, prefix: str = "") -> None:
    """As mmcv 1.3's save_checkpoint writes it: meta, a CPU state dict of the unwrapped model, the optimizer."""
    state = OrderedDict((prefix + k, v.detach().cpu()) for k, v in model.state_dict().items())
    opt = torch.optim.SGD([p for p in model.parameters()][:2], lr=0.02, momentum=0.9)
    torch.save({"meta": {"mmcv_version": "1.3.12", "time": time.asctime(), "epoch": 8, "iter": 296},
                "state_dict": state, "optimizer": opt.state_dict()}, path,
               _use_new_zipfile_serialization=not legacy)


@pytest.fixture(scope="module")
def cl_model():
    torch.manual_seed(0)
    return _randomise(_StitchUpClassifier(), seed=1)


@pytest.fixture(scope="module")
def images():
    return torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(2))


def _assert_same_logits(cl: nn.Module, ours: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        mixed, random, balance = cl.simple_test(x)
        got = ours.eval()(x)
    assert set(got) == {"random", "balanced"}
    for name, want in (("random", random), ("balanced", balance)):
        assert torch.allclose(got[name], want, rtol=1e-4, atol=1e-5), (name, (got[name] - want).abs().max())
    assert torch.allclose(ensemble_logits(got["random"], got["balanced"], 0.1), mixed, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ the conversion
@pytest.mark.parametrize("legacy, prefix", [(False, ""), (True, ""), (False, "module.")],
                         ids=["zip", "legacy-torch-1.4-format", "dataparallel-prefix"])
def test_the_converted_model_gives_cl_logits_for_each_branch(tmp_path, cl_model, images, legacy, prefix):
    path = tmp_path / "epoch_8.pth"
    _mmcv_checkpoint(cl_model, path, legacy=legacy, prefix=prefix)
    state, meta = read_cl_checkpoint(path)
    assert meta["epoch"] == 8 and set(state) == set(cl_model.state_dict())
    assert infer_architecture(state) == {"backbone": "resnet50", "num_classes": 20, "neck_dim": 256}
    ours, dropped = build_from_cl(state, source=str(path))
    # the necks' partner BatchNorm and unused hidden layer, nothing else, are left out
    assert sorted({k.split(".")[0] + "." + k.split(".")[1] for k in dropped}) == [
        "neck.bn2", "neck.fc_hidden_1", "neck1.bn2", "neck1.fc_hidden_1"]
    assert not ours.shares_frozen_trunk  # the two random backbones differ everywhere
    _assert_same_logits(cl_model, ours, images)


def test_partner_batchnorms_take_the_necks_bn2(cl_model, images):
    ours, dropped = build_from_cl(cl_model.state_dict(), partner_bn=True)
    assert all(".fc_hidden_1." in k for k in dropped)
    with torch.no_grad():
        for suffix, name in CL_BRANCHES.items():
            backbone, neck = getattr(cl_model, f"backbone{suffix}"), getattr(cl_model, f"neck{suffix}")
            maps = backbone(images)
            want = neck(maps, partner=True)
            got = ours.eval().embed_partner(name, ours.branches[name].feature_maps(images))
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_logits(cl_model, ours, images)


def test_identical_frozen_stages_run_once_and_give_the_same_logits(cl_model, images):
    """[CL] starts both backbones from the same ImageNet weights and trains layer4 only: after loading, the
    frozen stem + layer1-3 are one function and our model runs them once for both branches."""
    cl = copy.deepcopy(cl_model)
    frozen = ("conv1", "bn1", "layer1", "layer2", "layer3")
    cl.backbone1.load_state_dict({k: v for k, v in cl.backbone.state_dict().items()}, strict=True)
    with torch.no_grad():  # layer4 differs again, as after training
        for p in cl.backbone1.layer4.parameters():
            p.mul_(0.9)
    ours, _ = build_from_cl(cl.state_dict())
    assert ours.shares_frozen_trunk and all(hasattr(cl.backbone, m) for m in frozen)
    _assert_same_logits(cl, ours, images)


def test_branch_names_are_the_method_familys():
    assert tuple(CL_BRANCHES.values()) == BRANCH_NAMES


@pytest.fixture(scope="module")
def target(cl_model):
    return build_from_cl(cl_model.state_dict())[0]


def test_unmapped_missing_and_misshapen_keys_are_named(cl_model, target):
    state = dict(cl_model.state_dict())
    with pytest.raises(NoisyMLTError, match=r"1 key\(s\) of the checkpoint map to nothing.*head\.extra_scale"):
        convert_state_dict({**state, "head.extra_scale": torch.ones(1)}, target, "ck.pth")
    lacking = {k: v for k, v in state.items() if k != "backbone1.layer4.2.conv3.weight"}
    with pytest.raises(NoisyMLTError, match=r"ck\.pth: the checkpoint lacks 1 tensor.*branches\.balanced\.backbone"
                                            r"\.layer4\.2\.conv3\.weight"):
        convert_state_dict(lacking, target, "ck.pth")
    bad = {**state, "head1.fc_cls.weight": torch.zeros(80, 256)}
    with pytest.raises(NoisyMLTError, match=r"head1\.fc_cls\.weight \(80, 256\) -> branches\.balanced\.head\.fc"):
        convert_state_dict(bad, target, "ck.pth")
    # BatchNorm counters are optional (older torch did not save them)
    no_counters = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    converted, _ = convert_state_dict(no_counters, target)
    assert set(converted) == set(target.state_dict())
    with pytest.raises(NoisyMLTError, match="no key 'backbone1.conv1.weight'"):
        infer_architecture({k: v for k, v in state.items() if not k.startswith("backbone1.")})


def test_a_shared_backbone_takes_only_equal_backbones(cl_model):
    from noisymlt.models.twobranch import build_two_branch

    cfg = {"backbone": "resnet50", "pretrained": False, "neck_dim": 256, "trainable": "layer4", "frozen_bn": True}
    shared = build_two_branch(cfg, 20, {"random": 0.0, "balanced": 0.5}, shared_backbone=True)
    with pytest.raises(NoisyMLTError, match="two backbones .* differ"):
        convert_state_dict(cl_model.state_dict(), shared)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.ones(1)}, "meta": {"hook": _Evil(marker)}}, path)
    with pytest.raises(NoisyMLTError) as err:
        read_cl_checkpoint(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and "weights_only" in str(err.value)
    assert not marker.exists()


def test_the_cli_writes_our_state_dict(tmp_path, cl_model, images, capsys):
    path = tmp_path / "epoch_8.pth"
    _mmcv_checkpoint(cl_model, path)
    out = tmp_path / "converted.pt"
    assert main(["convert-cl-checkpoint", "--checkpoint", str(path), "--out", str(out)]) == 0
    saved = torch.load(out, map_location="cpu", weights_only=True)
    assert saved["meta"]["backbone"] == "resnet50" and saved["meta"]["source"] == "epoch_8.pth"
    assert saved["meta"]["branches"] == {"random": "backbone/neck/head", "balanced": "backbone1/neck1/head1"}
    ours, _ = build_from_cl(cl_model.state_dict())
    ours.load_state_dict(saved["model"])
    _assert_same_logits(cl_model, ours, images)
    with pytest.raises(SystemExit):
        main(["convert-cl-checkpoint", "--help"])
    assert "1eGBGqB0BfjMEpXEijBot8Hg7cCM831xr" in capsys.readouterr().out.replace("\n", "")
