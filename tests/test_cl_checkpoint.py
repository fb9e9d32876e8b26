"""A checkpoint of [CL]'s code converted into our two-branch model gives [CL]'s outputs.

[CL]'s network is rebuilt in tests/cl_network.py with its module names; its random weights and BatchNorm
statistics are saved the way mmcv saves a checkpoint, converted, and the logits compared.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from cl_network import StitchUpClassifier, mmcv_checkpoint, randomise
from noisymlt.cli import main
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.options import BRANCH_NAMES
from noisymlt.models.cl_checkpoint import (CL_BRANCHES, build_from_cl, convert_state_dict, infer_architecture,
                                           read_cl_checkpoint)
from noisymlt.models.twobranch import ensemble_logits


@pytest.fixture(scope="module")
def cl_model():
    torch.manual_seed(0)
    return randomise(StitchUpClassifier(), seed=1)


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
    mmcv_checkpoint(cl_model, path, legacy=legacy, prefix=prefix)
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
    mmcv_checkpoint(cl_model, path)
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
