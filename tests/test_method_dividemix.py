"""DivideMix: GMM co-divide, label refinement, sharpening, MixMatch, and a short Trainer run with resume."""

from __future__ import annotations

import copy
import io
import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from helpers import tiny_params, toy_trainer
from noisymlt.data.labels import read_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.methods import TrainContext
from noisymlt.config import resolve_run, validate_params
from noisymlt.methods.dividemix import (
    DivideMix,
    auto_warmup_epochs,
    clean_probability,
    mixmatch_lambda,
    ramp,
    refine_labels,
    resolve_options,
    sharpen,
)
from noisymlt.training.trainer import Trainer

BLOCK = {
    "family": "dividemix",
    "label": "DivideMix",
    "description": "two nets, GMM co-divide, MixMatch; class-aware sampling + BCE",
    "sampler": "class_aware",
    "warmup_epochs": "auto",
    "p_threshold": 0.5,
    "temperature": 0.5,
    "beta_alpha": 4.0,
    "lambda_u": 2.5,
    "rampup_epochs": 1.0,
    "gmm": {"max_iter": 10, "reg_covar": 0.0005, "tol": 0.01},
}


def dividemix_params(**block_overrides) -> dict:
    params = tiny_params("dividemix", image_size=16)  # 16 px keeps the two-net runs to seconds
    params["methods"]["dividemix"] = {**BLOCK, **block_overrides}
    validate_params(params)
    return params


def make_trainer(tiny_toy, out, **block_overrides) -> Trainer:
    resolved = resolve_run(dividemix_params(**block_overrides), "toy", "dividemix", 0.5, 0)
    return toy_trainer(tiny_toy, resolved, out)


# ---------------------------------------------------------------- pure pieces
def test_sharpen_hand_values():
    p = torch.tensor([0.0, 0.3, 0.5, 0.8, 1.0])
    expected = torch.tensor([0.0, 0.09 / (0.09 + 0.49), 0.5, 0.64 / (0.64 + 0.04), 1.0])
    torch.testing.assert_close(sharpen(p, 0.5), expected)
    torch.testing.assert_close(sharpen(p, 1.0), p)
    # the same as dividing the logit by T
    q = torch.tensor([0.1, 0.35, 0.9])
    torch.testing.assert_close(sharpen(q, 0.25), torch.sigmoid(torch.logit(q) / 0.25))


def test_refine_labels_hand_example():
    y = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    w = torch.tensor([0.75, 0.0])
    own = torch.tensor([[0.2, 0.6, 0.9], [0.4, 0.1, 0.7]])
    torch.testing.assert_close(refine_labels(y, w, own), torch.tensor([[0.8, 0.15, 0.975], [0.4, 0.1, 0.7]]))


def test_mixmatch_lambda_is_folded_and_reproducible():
    draws = [mixmatch_lambda(np.random.default_rng([0, i]), 4.0) for i in range(500)]
    assert min(draws) >= 0.5 and max(draws) <= 1.0
    assert len(set(draws)) == 500
    assert np.mean(draws) == pytest.approx(0.63, abs=0.02)  # E[max(l, 1 - l)] for Beta(4, 4) is ~0.637
    assert mixmatch_lambda(np.random.default_rng([0, 3]), 4.0) == draws[3]


def test_lambda_u_ramp():
    assert ramp(0, 5, 10, 1, 1.0) == 0.0  # warm-up
    assert ramp(1, 0, 10, 1, 1.0) == 0.0
    assert ramp(1, 5, 10, 1, 1.0) == pytest.approx(0.5)
    assert ramp(2, 0, 10, 1, 1.0) == 1.0
    assert ramp(2, 5, 10, 1, 2.0) == pytest.approx(0.75)


def test_clean_probability_labels_the_low_loss_cluster():
    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(0.1, 0.02, 70), rng.normal(2.0, 0.1, 30)])
    order = rng.permutation(100)
    losses = losses[order]
    clean = order < 70
    prob = clean_probability(losses, random_state=0)
    assert prob.shape == (100,)
    np.testing.assert_array_equal(prob > 0.5, clean)
    assert prob[clean].min() > 0.99 and prob[~clean].max() < 0.01
    # min-max normalisation: an affine change of the losses changes nothing
    np.testing.assert_allclose(clean_probability(3 * losses + 5, random_state=0), prob, atol=1e-6)
    np.testing.assert_array_equal(clean_probability(np.full(5, 0.7)), np.ones(5))  # no split in equal losses
    with pytest.raises(NoisyMLTError, match="finite"):
        clean_probability(np.array([0.1, np.nan]))


def test_options_defaults_and_validation():
    assert resolve_options({"family": "dividemix"})["warmup_epochs"] == "auto"
    o = resolve_options({"family": "dividemix", "warmup_epochs": 3, "gmm": {"tol": 0.1}})
    assert o["warmup_epochs"] == 3 and o["gmm"] == {"max_iter": 10, "reg_covar": 5e-4, "tol": 0.1}
    assert o["lambda_u"] == 2.5 and o["temperature"] == 0.5 and o["sampler"] == "class_aware"
    with pytest.raises(NoisyMLTError, match="p_threshold"):
        resolve_options({"family": "dividemix", "p_threshold": 1.5})
    with pytest.raises(NoisyMLTError, match="warmup_epochs"):
        resolve_options({"family": "dividemix", "warmup_epochs": "soon"})
    with pytest.raises(NoisyMLTError, match="methods.dividemix.*lamda_u"):
        dividemix_params(lamda_u=1.0)
    with pytest.raises(NoisyMLTError, match="methods.dividemix.gmm"):
        dividemix_params(gmm={"max_iter": 0})


@pytest.mark.parametrize("warmup_iters, iters, expected", [
    (500, 121, 5),   # VOC-MLT, [DB] schedule (class-aware, 121 iterations an epoch): capped at the decay
    (500, 705, 2),   # COCO-MLT, [DB] schedule: the lr warm-up fits in one epoch, plus one at full rate
    (100, 35, 4),    # VOC-MLT on [CL]'s schedule
    (320, 62, 5),    # the demo ([DB]'s warm-up scaled to the toy's size)
    (0, 10, 1),      # no lr warm-up: one full-rate epoch
])
def test_auto_warmup_covers_the_lr_warmup_plus_one_epoch_before_the_first_decay(warmup_iters, iters, expected):
    train = {"warmup_iters": warmup_iters, "lr_steps": [5, 7], "epochs": 8}
    assert auto_warmup_epochs(train, iters) == expected
    assert auto_warmup_epochs({**train, "warmup_iters": 10**6, "lr_steps": []}, iters) == 8  # no decay: the whole run


# ---------------------------------------------------------------- co-divide and one step on hand-made nets
class Lookup(nn.Module):
    """A 'network' whose logits for image i (encoded as the image's first value) are table[i]."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0].long()]


def make_ctx(noisy: torch.Tensor, iterate=None, **opts) -> TrainContext:
    cfg = {"seed": 0, "method_cfg": {"family": "dividemix", **opts},
           "train": {"epochs": 4, "batch_size": 4}}
    return TrainContext(cfg, noisy, {"head": [], "medium": [], "tail": []}, torch.device("cpu"), 10,
                        extra={"iterate_train": iterate} if iterate else {})


def test_co_divide_trains_each_net_with_the_peer_split():
    n, c = 12, 3
    noisy = torch.zeros(n, c)
    noisy[:, 0] = 1
    good = torch.tensor([4.0, -4.0, -4.0])  # confident and right: small loss
    table_a = good.repeat(n, 1)
    table_b = good.repeat(n, 1)
    table_a[:4] = -good  # net a finds images 0-3 hard, net b images 8-11
    table_b[8:] = -good
    model = nn.ModuleDict({"a": Lookup(table_a), "b": Lookup(table_b)})

    def iterate():
        for start in range(0, n, 5):  # uneven last batch
            idx = torch.arange(start, min(start + 5, n))
            yield idx, idx.float().view(-1, 1)

    method = DivideMix(make_ctx(noisy, iterate, warmup_epochs=1))
    method.on_epoch_start(model, 0)  # warm-up: no split yet
    assert method.prob is None and method.divided_epoch == -1
    method.on_epoch_start(model, 1)
    assert method.divided_epoch == 1 and method.prob.shape == (2, n)
    labelled = method.prob > 0.5
    assert labelled[0].tolist() == [True] * 8 + [False] * 4  # net a trains with net b's split
    assert labelled[1].tolist() == [False] * 4 + [True] * 8
    assert model.training  # back in train mode after scoring

    # resume: the split survives state_dict -> torch.save -> torch.load(weights_only) -> load_state_dict
    buf = io.BytesIO()
    torch.save(method.state_dict(), buf)
    buf.seek(0)
    fresh = DivideMix(make_ctx(noisy, iterate, warmup_epochs=1))
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    torch.testing.assert_close(fresh.prob, method.prob)
    assert fresh.divided_epoch == 1
    empty = DivideMix(make_ctx(noisy))
    empty.load_state_dict(DivideMix(make_ctx(noisy)).state_dict())
    assert empty.prob is None and empty.divided_epoch == -1


def test_net_loss_all_labelled_is_plain_bce_and_all_unlabelled_matches_coguess():
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    x = torch.randn(1, 5).repeat(6, 1)  # identical images and views: mixing is the identity
    y = torch.tensor([[1.0, 0.0, 1.0]]).repeat(6, 1)
    method = DivideMix(make_ctx(torch.zeros(6, 3)))
    rng = np.random.default_rng(0)

    lx, lu, frac = method.net_loss(net, copy.deepcopy(net), x, x, y, torch.ones(6), rng)
    z = net(x[:1])
    expected = (y[:1] * nn.functional.softplus(-z) + (1 - y[:1]) * nn.functional.softplus(z)).mean()
    assert frac == 1.0 and lu.item() == 0.0
    torch.testing.assert_close(lx, expected)
    lx.backward()
    assert net.weight.grad is not None and net.weight.grad.abs().sum() > 0

    net.zero_grad()
    lx, lu, frac = method.net_loss(net, copy.deepcopy(net), x, x, y, torch.zeros(6), rng)
    p = torch.sigmoid(net(x[:1]))
    guess = p.detach() ** 2 / (p.detach() ** 2 + (1 - p.detach()) ** 2)  # both nets agree; T = 0.5
    assert frac == 0.0 and lx.item() == 0.0
    torch.testing.assert_close(lu, ((p - guess) ** 2).mean())
    lu.backward()
    assert net.weight.grad.abs().sum() > 0


def test_net_loss_mixed_batch_uses_the_clean_probability_threshold():
    torch.manual_seed(1)
    net, peer = nn.Linear(4, 2), nn.Linear(4, 2)
    x1, x2 = torch.randn(8, 4), torch.randn(8, 4)
    y = torch.randint(0, 2, (8, 2)).float()
    w = torch.tensor([0.9, 0.1, 0.51, 0.5, 0.7, 0.2, 0.99, 0.0])
    method = DivideMix(make_ctx(torch.zeros(8, 2)))
    lx, lu, frac = method.net_loss(net, peer, x1, x2, y, w, np.random.default_rng(5))
    assert frac == 0.5  # 0.5 itself is not > p_threshold
    assert torch.isfinite(lx) and torch.isfinite(lu) and lx.item() > 0 and lu.item() > 0
    again = method.net_loss(net, peer, x1, x2, y, w, np.random.default_rng(5))
    assert again[0].item() == lx.item() and again[1].item() == lu.item()  # same rng -> same step


# ---------------------------------------------------------------- end to end on the tiny toy set
@pytest.fixture(scope="module")
def dividemix_run(tiny_toy, tmp_path_factory):
    """One 2-epoch run (warm-up, then a co-divide epoch); keeps the epoch-1 checkpoint as ``epoch1.pt``."""
    out = tmp_path_factory.mktemp("dividemix") / "run"
    trainer = make_trainer(tiny_toy, out, warmup_epochs=1)
    trainer.checkpoint_seconds = 0.0  # a checkpoint after every epoch (module scope: conftest's patch is not on yet)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    save = trainer.save_checkpoint

    def save_and_keep(epoch, history):
        save(epoch, history)
        if epoch == 1:
            shutil.copy(trainer.ckpt_path, out / "epoch1.pt")

    trainer.save_checkpoint = save_and_keep
    trainer.run()
    return trainer, before, out


def test_trainer_run_goes_through_the_co_divide(dividemix_run):
    trainer, before, out = dividemix_run
    assert trainer.method.warmup == 1 and trainer.method.divided_epoch == 1
    after = trainer.model.state_dict()
    for net in ("a", "b"):
        assert any(not torch.equal(before[k], after[k]) for k in before
                   if k.startswith(net + ".") and after[k].is_floating_point())
    n = len(trainer.train_table)
    prob = trainer.method.prob
    assert prob.shape == (2, n) and ((prob >= 0) & (prob <= 1)).all()
    assert not torch.equal(prob[0], prob[1])  # two nets, two splits
    labelled = (prob > 0.5).float().mean(1)
    assert ((labelled > 0) & (labelled < 1)).all()

    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2]
    assert "lx_a" not in log[0] and np.isfinite(log[0]["loss"])
    for key in ("loss", "loss_a", "loss_b", "lx_a", "lu_b", "labelled_a", "labelled_b", "lambda_u"):
        assert np.isfinite(log[1][key]), key
    assert 0 < log[1]["lambda_u"] < 2.5  # ramping up over the first epoch after warm-up

    pred = np.load(out / "predictions.npz")
    assert list(pred["heads"]) == ["main"]
    scores = pred["scores_main"]
    assert scores.shape == (200, 20) and np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()

    state = torch.load(out / "checkpoint.pt", weights_only=True)
    torch.testing.assert_close(state["method"]["prob"], prob.cpu())


def test_run_resumed_after_warm_up_repeats_the_co_divide_epoch_exactly(dividemix_run, tiny_toy, tmp_path):
    trainer, _, out = dividemix_run
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copy(out / "epoch1.pt", resumed_dir / "checkpoint.pt")
    resumed = make_trainer(tiny_toy, resumed_dir, warmup_epochs=1)
    resumed.run()
    assert resumed.method.divided_epoch == 1
    torch.testing.assert_close(resumed.method.prob, trainer.method.prob, rtol=0, atol=0)
    np.testing.assert_array_equal(np.load(resumed_dir / "predictions.npz")["scores_main"],
                                  np.load(out / "predictions.npz")["scores_main"])  # bit-identical on the CPU


def test_co_divide_separates_truly_noisy_from_clean_images(tiny_toy, tmp_path):
    """DivideMix's premise on noisy multi-label data: after the warm-up, the clean probability ranks the
    images whose noisy label vector is right above those it got wrong. The clean labels are read here,
    by the test, and never reach training."""
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    params = tiny_params("dividemix", image_size=32, epochs=3, lr_steps=[5], warmup_iters=10, lr=0.05,
                         new_layers_lr_mult=1.0,  # one lr for every layer, as DivideMix's code
                         photometric=True)  # the references' augmentation (the demo's toy drops it)
    params["methods"]["dividemix"] = {**BLOCK, "warmup_epochs": "auto"}
    trainer = toy_trainer(tiny_toy, resolve_run(params, "toy", "dividemix", 0.5, 0), tmp_path / "run")
    assert trainer.method.warmup == 2  # ceil(10 / iterations per epoch) + 1: two warm-up epochs
    trainer.fit()  # warm-up, warm-up, then the first co-divide and one epoch on its split
    assert trainer.method.divided_epoch == 2
    table = pd.read_parquet(tiny_toy["noisy"])
    classes = list(read_labels(tiny_toy["noisy"]).classes)
    clean = (table[classes].to_numpy() == table[[f"clean_{c}" for c in classes]].to_numpy()).all(1)
    assert 0.2 < clean.mean() < 0.8  # both kinds are present at gamma 0.5
    aucs = [roc_auc_score(clean, row) for row in trainer.method.prob.cpu().numpy()]  # each net's split
    # Noisy rows carry more labels (kept + replacements): the split must beat that cue by far, not echo it.
    by_count = roc_auc_score(clean, -table[classes].to_numpy().sum(1))
    assert min(aucs) > 0.7 and min(aucs) > by_count + 0.1, (aucs, by_count)


@pytest.mark.parametrize("epoch", [0, 1])  # warm-up, then a MixMatch step with labelled and unlabelled images
def test_nets_with_one_frozen_prefix_run_it_once_for_the_same_loss_gradients_and_scores(epoch):
    """Both nets from one pretrained file (here: a copy) with the same frozen stages: the prefix runs once on
    the images both see; loss, gradients, co-divide losses and test scores are those of two whole forwards."""
    from noisymlt.models.branch import build_branch

    torch.manual_seed(0)
    cfg = {"backbone": "resnet_tiny", "pretrained": False, "weights_path": None, "neck_dim": 16,
           "trainable": "layer2", "frozen_bn": True}
    a = build_branch(cfg, 3)
    b = copy.deepcopy(a)
    for part in (b.backbone.layer2, b.backbone.layer3, b.backbone.layer4, b.neck, b.head):  # the trained parts differ
        for p in part.parameters():
            nn.init.normal_(p, std=0.1)
    n = 8
    noisy = torch.randint(0, 2, (n, 3)).float()
    images = torch.randn(n, 2, 3, 16, 16)
    batch = {"main": {"index": torch.arange(n)[:, None].repeat(1, 2), "images": images}}

    def run(share: bool):
        model = copy.deepcopy(nn.ModuleDict({"a": a, "b": b})).train()
        method = DivideMix(make_ctx(noisy, lambda: iter([(torch.arange(n), images[:, 0])]), warmup_epochs=1))
        method._shares_prefix = share
        method.prob = torch.tensor([[0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4]] * 2)
        loss, _ = method.training_loss(model, batch, epoch, 3)
        loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        model.eval()
        with torch.no_grad():
            scores = method.predict(model, images[:, 1])["main"]
        return loss.detach(), grads, method.sample_losses(model), scores

    with torch.no_grad():
        assert frozen_trunks_identical_of(a, b)
    shared, whole = run(True), run(False)
    torch.testing.assert_close(shared[0], whole[0], rtol=1e-6, atol=1e-7)
    assert shared[1].keys() == whole[1].keys() and shared[1]  # the frozen prefix has no gradient either way
    for name in whole[1]:
        torch.testing.assert_close(shared[1][name], whole[1][name], rtol=1e-5, atol=1e-7)
    for net in ("a", "b"):
        np.testing.assert_allclose(shared[2][net], whole[2][net], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(shared[3], whole[3], rtol=1e-6, atol=1e-7)
    # and sharing is switched on by itself only for such nets
    method = DivideMix(make_ctx(noisy))
    assert method.shared_prefix(nn.ModuleDict({"a": a, "b": b}), images[:, 0]) is not None
    method = DivideMix(make_ctx(noisy))
    assert method.shared_prefix(nn.ModuleDict({"a": a, "b": build_branch(cfg, 3)}), images[:, 0]) is None


def frozen_trunks_identical_of(a, b) -> bool:
    from noisymlt.models.twobranch import frozen_trunks_identical

    return frozen_trunks_identical([a, b])
