"""Backbones and the [CL] branch: freezing policy, frozen BatchNorm, neck/head init, offline weights."""

from __future__ import annotations

import urllib.error

import numpy as np
import pytest
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import build_backbone
from noisymlt.models.branch import Branch

PAPER = {"backbone": "resnet50", "pretrained": False, "weights_path": None, "trainable": "layer4", "frozen_bn": True,
         "neck_dim": 256}


def test_resnet50_branch_trains_only_layer4_neck_head_with_frozen_bn():
    torch.manual_seed(0)
    branch = Branch(build_backbone("resnet50"), 20, neck_dim=256, dropout=0.5, trainable="layer4", frozen_bn=True)
    trainable = {n.split(".")[0] + "." + n.split(".")[1] for n, p in branch.named_parameters() if p.requires_grad}
    assert trainable == {"backbone.layer4", "neck.fc", "neck.bn", "head.fc"}
    branch.train()
    bns = [m for m in branch.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns)
    assert branch.neck.bn.training and branch.neck.drop.training
    # neck: fc 2048 -> 256 kaiming fan_out; head: N(0, 0.01), bias 0
    assert branch.neck.fc.weight.shape == (256, 2048)
    assert branch.neck.fc.weight.std().item() == pytest.approx((2 / 256) ** 0.5, rel=0.05)
    assert branch.head.fc.weight.std().item() == pytest.approx(0.01, rel=0.1)
    assert torch.count_nonzero(branch.head.fc.bias) == 0
    x = torch.randn(2, 3, 64, 64)
    running = bns[0].running_mean.clone()
    branch(x).sum().backward()
    assert torch.equal(bns[0].running_mean, running)  # statistics untouched in training mode
    assert branch.backbone.layer3[0].conv1.weight.grad is None
    assert branch.backbone.layer4[0].conv1.weight.grad is not None


def test_offline_imagenet_weights_give_a_clear_message(monkeypatch):
    import torchvision

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline, raising=False)
    with pytest.raises(NoisyMLTError, match="pretrained: false"):
        build_backbone("resnet18", pretrained=True)


def test_local_weights_file_is_loaded(tmp_path):
    import torchvision

    net = torchvision.models.resnet18(weights=None)
    torch.nn.init.constant_(net.layer1[0].conv1.weight, 0.5)
    torch.save(net.state_dict(), tmp_path / "r18.pth")
    trunk = build_backbone("resnet18", weights_path=str(tmp_path / "r18.pth"))
    assert torch.all(trunk.layer1[0].conv1.weight == 0.5)
    with pytest.raises(NoisyMLTError, match="does not exist"):
        build_backbone("resnet18", weights_path=str(tmp_path / "missing.pth"))


def test_unknown_backbone_is_refused():
    with pytest.raises(NoisyMLTError, match="unknown backbone 'vgg'"):
        build_backbone("vgg")


def test_prior_bias_init_puts_every_linear_heads_outputs_at_the_class_frequencies():
    from torch import nn

    from noisymlt.models.heads import PRIOR_CLIP, CosineHead, Head, init_bias_at_prior

    labels = torch.zeros(200, 4)
    labels[:50, 0] = 1  # 0.25
    labels[:2, 1] = 1  # 0.01
    labels[:, 3] = 1  # 1.0 -> clipped
    model = nn.ModuleDict({"a": Head(8, 4), "b": nn.Sequential(Head(8, 4)), "cos": CosineHead(8, 4)})
    cosine = model["cos"].weight.detach().clone()
    assert init_bias_at_prior(model, labels.numpy()) == 2
    expected = torch.tensor([0.25, 0.01, PRIOR_CLIP, 1 - PRIOR_CLIP])
    for head in (model["a"], model["b"][0]):
        assert torch.allclose(torch.sigmoid(head.fc.bias), expected, rtol=1e-5)
        # with zero features the outputs are the priors
        assert torch.allclose(torch.sigmoid(head(torch.zeros(1, 8)))[0], expected, rtol=1e-5)
    assert torch.equal(model["cos"].weight, cosine)


def test_trainer_applies_the_prior_bias_only_when_asked(tiny_toy, tmp_path):
    from helpers import tiny_params, toy_trainer
    from noisymlt.models.heads import Head
    from noisymlt.config import resolve_run

    for init in ("zero", "prior"):
        params = tiny_params("erm", epochs=1, lr_steps=[1], image_size=16)
        params["train"]["head_bias_init"] = init
        trainer = toy_trainer(tiny_toy, resolve_run(params, "toy", "erm", 0.5, 0), tmp_path / init, limit_iters=1)
        (head,) = [m for m in trainer.model.modules() if isinstance(m, Head)]
        freq = trainer.train_table.labels.mean(0).clip(1e-3, 1 - 1e-3)
        want = torch.zeros(len(freq)) if init == "zero" else torch.as_tensor(np.log(freq / (1 - freq))).float()
        assert torch.allclose(head.fc.bias.detach(), want, atol=1e-6), init


def test_the_half_width_tiny_resnet_has_the_same_stages_at_half_the_channels():
    from noisymlt.models.backbones import OUT_DIMS, build_backbone

    full, half = build_backbone("resnet_tiny"), build_backbone("resnet_tiny_half")
    x = torch.randn(2, 3, 32, 32)
    assert full.out_dim == 2 * half.out_dim == OUT_DIMS["resnet_tiny"]
    assert full(x).shape[2:] == half(x).shape[2:] and half(x).shape[1] == 64
    assert [n for n, _ in full.named_children()] == [n for n, _ in half.named_children()]
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert 3.5 < n_params(full) / n_params(half) < 4.5  # widths halve: about a quarter of the weights


@pytest.mark.parametrize("channels_last", [True, False])
def test_global_average_matches_autograds_mean_and_keeps_the_maps_memory_format_in_its_gradient(channels_last):
    """The neck's pooling: values and gradients bit-equal to ``maps.mean(dim=(2, 3))``'s, and the gradient that
    reaches the maps (a ReLU's output in the trunk, not a leaf) laid out as the maps are: autograd's own is
    contiguous, which put the trunk's last ReLU on PyTorch's slow mixed-format kernel under channels_last."""
    from noisymlt.models.heads import global_average

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 4, 3, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weights = torch.randn(6, 5, generator=g)
    grads = {}
    outs = {}
    for name, pool in (("ours", global_average), ("autograd", lambda m: m.mean(dim=(2, 3)))):
        leaf = x.clone().requires_grad_()
        maps = torch.relu(leaf)  # as the trunk's last block ends
        maps.register_hook(lambda grad, name=name: grads.__setitem__(name, grad))
        outs[name] = pool(maps)
        (outs[name] * weights).sum().backward()
        grads[name + " leaf"] = leaf.grad
    assert torch.equal(outs["ours"], outs["autograd"])
    assert torch.equal(grads["ours"], grads["autograd"]) and torch.equal(grads["ours leaf"], grads["autograd leaf"])
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert grads["ours"].is_contiguous(memory_format=layout)
    assert not channels_last or not grads["autograd"].is_contiguous(memory_format=torch.channels_last)  # the mend
