"""The demo's ImageNet analogue: a disjoint synthetic source task, pretraining, and weights_path loading."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from noisymlt.data.toy import GLYPHS
from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import build_backbone
from noisymlt.models.branch import Branch
from noisymlt.training.pretrain import make_source_set, pretrain, source_glyphs

SMALL = {"epochs": 3, "batch_size": 32, "lr": 0.1, "cpu_threads": 1,
         "source": {"seed": 0, "classes": 6, "images_per_class": 40, "held_out_per_class": 10, "size": 64}}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrained") / "toy_small.pt"
    report = pretrain(SMALL, out, progress=False)
    return out, report


def test_source_classes_are_disjoint_from_the_toy_classes_and_distinct():
    glyphs = source_glyphs(48, 0)
    targets = {(g.shape, g.colour, g.texture) for g in GLYPHS}
    combos = [(g.shape, g.colour, g.texture) for g in glyphs]
    assert len(set(combos)) == 48 and not set(combos) & targets
    assert len({g.name for g in glyphs}) == 48
    assert source_glyphs(48, 0) == glyphs and source_glyphs(48, 1) != glyphs
    with pytest.raises(NoisyMLTError, match="source.classes"):
        source_glyphs(10_000, 0)


def test_source_set_is_single_label_balanced_and_deterministic():
    glyphs, train_x, train_y, test_x, test_y = make_source_set(SMALL["source"])
    assert len(glyphs) == 6 and len(train_x) == 240 and len(test_x) == 60
    assert np.bincount(train_y).tolist() == [40] * 6 and np.bincount(test_y).tolist() == [10] * 6
    again = make_source_set(SMALL["source"])
    assert again[1] == train_x and np.array_equal(again[2], train_y)  # identical JPEG bytes


def test_pretraining_learns_the_source_task_and_is_reproducible(weights, tmp_path):
    out, report = weights
    assert report["held_out_accuracy"] > 3 / 6  # chance is 1/6
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    assert json.loads(out.with_suffix(".json").read_text())["held_out_accuracy"] == report["held_out_accuracy"]
    again = tmp_path / "again.pt"
    pretrain({**SMALL, "epochs": 1}, again, progress=False)
    pretrain({**SMALL, "epochs": 1}, tmp_path / "again2.pt", progress=False)
    a, b = torch.load(again, weights_only=True), torch.load(tmp_path / "again2.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_weights_path_loads_the_pretrained_backbone_like_imagenet_weights(weights):
    out, _ = weights
    state = torch.load(out, weights_only=True)
    trunk = build_backbone("resnet_tiny", weights_path=str(out))
    torch.testing.assert_close(trunk.layer3[0].conv1.weight, state["layer3.0.conv1.weight"])
    torch.testing.assert_close(trunk.stem[1].running_var, state["bn1.running_var"])
    scratch = build_backbone("resnet_tiny")
    assert not torch.equal(scratch.layer3[0].conv1.weight, trunk.layer3[0].conv1.weight)


def test_bad_weights_files_name_the_file(tmp_path, weights):
    missing = tmp_path / "nope.pt"
    with pytest.raises(NoisyMLTError, match="nope.pt does not exist"):
        build_backbone("resnet_tiny", weights_path=str(missing))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(NoisyMLTError, match="corrupt.pt is not a resnet_tiny state dict"):
        build_backbone("resnet_tiny", weights_path=str(corrupt))
    with pytest.raises(NoisyMLTError, match="toy_small.pt is not a resnet18 state dict"):
        build_backbone("resnet18", weights_path=str(weights[0]))  # another architecture's weights
    with pytest.raises(NoisyMLTError, match="no published weights"):
        build_backbone("resnet_tiny", pretrained=True)


def test_fine_tuning_follows_the_paper_policy(weights):
    """[CL]: layer4 + neck + head train, the rest is frozen, backbone BatchNorm keeps its statistics;
    [DB]'s frozen_stages=1: layer2 onwards."""
    out, _ = weights
    for policy, trained in (("layer4", {"layer4"}), ("layer2", {"layer2", "layer3", "layer4"})):
        branch = Branch(build_backbone("resnet_tiny", weights_path=str(out)), 5, neck_dim=16, trainable=policy,
                        frozen_bn=True)
        stages = {n.split(".")[1] for n, p in branch.named_parameters() if p.requires_grad and n.startswith("backbone.")}
        assert stages == trained
        before = {k: v.clone() for k, v in branch.backbone.state_dict().items() if "running" in k}
        branch.train()
        branch(torch.randn(8, 3, 32, 32)).sum().backward()
        assert all(torch.equal(v, branch.backbone.state_dict()[k]) for k, v in before.items())
        assert branch.head.fc.weight.grad is not None and branch.backbone.stem[0].weight.grad is None
    with pytest.raises(NoisyMLTError, match="trainable"):
        build_backbone("resnet_tiny").trainable_parts("layer5")


def test_cli_writes_weights_and_report(tmp_path):
    config = json.dumps({**SMALL, "epochs": 1})
    out = tmp_path / "cli.pt"
    proc = subprocess.run([sys.executable, "-m", "noisymlt", "pretrain", "--config", config, "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and "held-out accuracy" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "noisymlt", "pretrain", "--config", '{"epoch": 3}', "--out",
                          str(tmp_path / "x.pt")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown key(s) ['epoch']" in bad.stderr


def test_bf16_pretraining_autocasts_the_step_and_stays_reproducible(tmp_path):
    """cpu_precision bf16: the step runs under bf16 autocast, so its weights differ from fp32's,
    and two runs still give the same bytes."""
    one = {**SMALL, "epochs": 1}
    paths = {name: tmp_path / f"{name}.pt" for name in ("fp32", "bf16", "bf16_again")}
    pretrain(one, paths["fp32"], progress=False)
    pretrain({**one, "cpu_precision": "bf16"}, paths["bf16"], progress=False)
    pretrain({**one, "cpu_precision": "bf16"}, paths["bf16_again"], progress=False)
    w = {name: torch.load(p, weights_only=True) for name, p in paths.items()}
    assert all(torch.equal(w["bf16"][k], w["bf16_again"][k]) for k in w["bf16"])
    assert not torch.equal(w["bf16"]["conv1.weight"], w["fp32"]["conv1.weight"])
    assert all(v.dtype == w["fp32"][k].dtype for k, v in w["bf16"].items())  # the state dict stays fp32
