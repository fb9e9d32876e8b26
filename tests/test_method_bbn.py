"""BBN: cumulative-learning schedule, branch structure (shared trunk, duplicated last stage), mixing
of the two branches in training and at test time, and a short Trainer run on the tiny toy data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import tiny_params, toy_trainer
from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import SmallCNN, build_backbone
from noisymlt.models.bbn import BBNNet, bbn_alpha
from noisymlt.config import resolve_run, validate_params

BBN_BLOCK = {"family": "bbn", "label": "BBN", "description": "test block", "loss": "bce", "split_at": "stage"}


def small_bbn(num_classes: int = 5, **kw) -> BBNNet:
    torch.manual_seed(0)
    return BBNNet(SmallCNN(width=8), num_classes, **kw)


def test_alpha_schedule_values():
    assert bbn_alpha(0, 8) == 1.0
    assert bbn_alpha(1, 8) == pytest.approx(1 - 1 / 64)
    assert bbn_alpha(4, 8) == pytest.approx(0.75)
    assert bbn_alpha(7, 8) == pytest.approx(1 - 49 / 64)
    assert [bbn_alpha(t, 2) for t in range(2)] == [1.0, 0.75]
    with pytest.raises(NoisyMLTError):
        bbn_alpha(8, 8)


def test_trunk_is_shared_and_last_stage_duplicated():
    backbone = SmallCNN(width=8)
    body_params = sum(p.numel() for p in backbone.parameters())
    last_block = list(backbone.body[-3:].parameters())
    model = BBNNet(backbone, 5)
    # The shared trunk is the backbone minus its last conv block, held once.
    assert model.shared[-1].__class__ is nn.MaxPool2d
    assert isinstance(model.stage_c[0], nn.Conv2d) and isinstance(model.stage_r[0], nn.Conv2d)
    stage_params = sum(p.numel() for p in model.stage_c.parameters())
    n_total = sum(p.numel() for p in model.parameters())  # parameters() lists each tensor once
    assert n_total == body_params + stage_params + (2 * 64 + 1) * 5
    # The two stages start equal but are separate tensors (the re-balancing one is a copy).
    assert model.stage_c[0].weight is last_block[0]
    for pc, pr in zip(model.stage_c.parameters(), model.stage_r.parameters()):
        assert pc is not pr and torch.equal(pc, pr)
    with torch.no_grad():
        model.stage_c[0].weight.add_(1.0)
    assert not torch.equal(model.stage_c[0].weight, model.stage_r[0].weight)


def test_resnet_split_and_layer4_policy():
    backbone = build_backbone("resnet18", pretrained=False)
    model = BBNNet(backbone, 4, trainable="layer4", frozen_bn=True)
    assert len(model.stage_c) == 2 and len(model.shared) == 4  # stem, layer1-3 | whole layer4 per branch
    assert not any(p.requires_grad for p in model.shared.parameters())
    assert all(p.requires_grad for p in model.stage_c.parameters())
    assert all(p.requires_grad for p in model.stage_r.parameters())
    assert all(p.requires_grad for p in model.classifier.parameters())
    model.train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    assert model.classifier.training

    block = BBNNet(build_backbone("resnet18", pretrained=False), 4, split_at="block")
    assert type(block.stage_c).__name__ == "BasicBlock" and len(block.shared) == 5  # + layer4[:-1]
    x = torch.randn(2, 3, 32, 32)
    assert block(x).shape == model(x).shape == (2, 4)


def test_training_mix_and_test_time_alpha_half():
    model = small_bbn().eval()
    x_c, x_r = torch.randn(3, 3, 32, 32), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        f_c = model.stage_c(model.shared(x_c)).mean(dim=(2, 3))
        f_r = model.stage_r(model.shared(x_r)).mean(dim=(2, 3))
        w, b = model.classifier.fc.weight, model.classifier.fc.bias
        w_c, w_r = w[:, :64], w[:, 64:]
        expected = 2 * (0.3 * f_c @ w_c.T + 0.7 * f_r @ w_r.T) + b  # BBN's bbn_mix: factor 2
        torch.testing.assert_close(model(x_c, x_r, alpha=0.3), expected)
        # Test time: one image through both branches, alpha 0.5: the classifier reads [f_c, f_r].
        g_c, g_r = model.branch_features(x_c)
        torch.testing.assert_close(model(x_c), g_c @ w_c.T + g_r @ w_r.T + b)
        torch.testing.assert_close(model(x_c), model(x_c, x_c, alpha=0.5))
        assert not torch.allclose(model(x_c), model(x_c, x_c, alpha=0.9))


def test_alpha_one_trains_only_the_conventional_stage():
    model = small_bbn()
    model.train()
    logits = model(torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32), alpha=1.0)
    logits.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.stage_r.parameters())
    assert all(p.grad is not None and p.grad.any() for p in model.stage_c.parameters() if p.dim() > 1)
    assert model.shared[0].weight.grad.any()
    model.zero_grad()
    model(torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32), alpha=0.0).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.stage_c.parameters())
    assert model.shared[0].weight.grad.any()  # the shared trunk learns from the reversed stream too


def bbn_params(**train):
    params = tiny_params("bbn", **train)
    params["methods"]["bbn"] = dict(BBN_BLOCK)
    validate_params(params)
    return params


def test_schema_rejects_unknown_split():
    params = bbn_params()
    params["methods"]["bbn"]["split_at"] = "layer3"
    with pytest.raises(NoisyMLTError, match="split_at"):
        validate_params(params)


def test_trainer_run_on_tiny_toy(tiny_toy, tmp_path):
    resolved = resolve_run(bbn_params(epochs=2, lr_steps=[2], image_size=16), "toy", "bbn", 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run")
    assert [s.name for s in trainer.method.streams()] == ["conventional", "rebalancing"]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.run()
    after = trainer.model.state_dict()
    for prefix in ("shared.", "stage_c.", "stage_r.", "classifier."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix)
                   and after[k].is_floating_point()), prefix
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["alpha"] for r in log] == [1.0, 0.75]
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in log)
    pred = np.load(tmp_path / "run" / "predictions.npz")
    assert list(pred["heads"]) == ["main"]
    scores = pred["scores_main"]
    assert scores.shape == (200, 20) and np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()


def test_demo_trains_the_classifier_at_ten_times_the_lr(tiny_toy, tmp_path):
    # The demo's regime (train.new_layers_lr_mult), not BBN's code (one lr for all, params.yaml): on the toy
    # backbone's raw features a classifier at the recipe's lr stays unfitted (experiments/bbn_mlgcn/experiment_bbn_mlgcn.py).
    from noisymlt.config import load_params

    repo = Path(__file__).resolve().parents[1]
    assert load_params(repo / "params.yaml")["train"]["new_layers_lr_mult"] == 1
    demo = load_params(repo / "params.yaml", repo / "workflow/profiles/demo/params.yaml")
    assert demo["train"]["new_layers_lr_mult"] == 10
    params = tiny_params("bbn", epochs=1, lr_steps=[1], image_size=16)
    params["train"]["new_layers_lr_mult"] = demo["train"]["new_layers_lr_mult"]
    resolved = resolve_run(params, "toy", "bbn", 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run", limit_iters=3)
    trainer.fit()
    groups = {id(p): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    head = {id(p) for p in trainer.model.classifier.parameters()}
    rest = {id(p) for n, p in trainer.model.named_parameters() if not n.startswith("classifier.") and p.requires_grad}
    (base,) = {groups[i] for i in rest}  # one rate for trunk and branches
    assert head and all(groups[i] == pytest.approx(10 * base, rel=1e-12) for i in head)


