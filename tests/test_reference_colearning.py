"""Ours against a short transcription of the authors' code [CL] (VamosC/CoLearning-meet-StitchUp).

The ``Ref*`` classes and ``ref_*`` helpers below re-write, in this project's words, the few lines of [CL]
that define one training step of the two-branch model and its test-time output: the PFC neck with its
partner BatchNorm (mllt/models/necks/pfc.py), ResampleLoss as DB-Focal and BCELoss (mllt/models/losses),
``union_label`` and ``StitchUpClassifier.adjust_labels`` / ``forward_train`` / ``simple_test``
(mlltn/models/classifiers), the sum of the two branch losses (``batch_processor`` in mlltn/train/train.py),
``freeze_layer`` (mllt/apis/train.py: only names with head, neck or layer4 train), the backbone's
``norm_eval`` (every backbone BatchNorm stays in eval mode), and mmcv 1.3.12's ``OptimizerHook``
(gradient-norm clipping at 35) and step schedule with linear warm-up. Settings are [CL]'s VOC config
(configs/voc/LT_dual_resnet50.py), except the thresholds: [CL] passes them on the command line, and these
tests use asymmetric ones so that a mix-up of the two branches' thresholds shows.

Both sides get the same weights (deep copies; the reference applies [CL]'s freezing itself) and the same
random images and noisy labels, and draw their dropout masks in the same order from the same seed. One
step must then give the same total loss, per-branch losses, union targets, gradients and BatchNorm
statistics within 1e-5. Each ``MUTATIONS`` entry changes one line of the transcription; the same
comparison must then fail, which shows that the check can see that difference.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from noisymlt.methods import FAMILIES, TrainContext
from noisymlt.methods import colearning as family
from noisymlt.methods.stitchup import union_targets
from noisymlt.config import load_params, resolve_run
from noisymlt.training.schedule import lr_at

PROJECT = Path(__file__).resolve().parents[1]
C = 6
SPLIT = {"head": [0, 1], "medium": [2, 3], "tail": [4, 5]}
N_IMAGES = 40
BATCH = {"random": 6, "balanced": 10}
IMAGE_SIZE = 16
# Per source branch (whose predictions correct the other's labels), as the project's params.yaml keys them.
THRESHOLDS = {
    "random": {"alpha": {"head": 0.6, "medium": 0.8}, "beta": {"medium": 0.3, "tail": 0.35}},
    "balanced": {"alpha": {"head": 0.75, "tail": 0.7}, "beta": {"head": 0.2, "tail": 0.25}},
}
TRAIN = {"backbone": "resnet_tiny", "trainable": "layer4", "frozen_bn": True, "image_size": IMAGE_SIZE,
         "batch_size": BATCH["random"], "balanced_batch_size": BATCH["balanced"], "neck_dim": 256}
TOL = {"rtol": 1e-5, "atol": 1e-5}

torch.set_num_threads(1)  # 2 shared cores; every model here is tiny


# ================================================================ transcriptions of [CL]
# mllt/models/necks/pfc.py, PFC with bn=True, layers=1, relu=False (the config's values)


class RefPFC(nn.Module):
    """GAP -> fc -> BatchNorm -> dropout. With a second input (the Stitch-Up partner) the partner goes
    through its own BatchNorm ``bn2``, each through the dropout, and the output is their average."""

    def __init__(self, fc: nn.Linear, bn: nn.BatchNorm1d, bn2: nn.BatchNorm1d, dropout: float):
        super().__init__()
        self.fc, self.bn, self.bn2 = copy.deepcopy(fc), copy.deepcopy(bn), copy.deepcopy(bn2)
        self.dropout = dropout
        if self.dropout > 0:
            self.drop = nn.Dropout(self.dropout)
        self.partner_bn = True  # mutation "no_partner_bn": the partner goes through ``bn``

    def forward(self, x, need_feat=False, x2=None, use_bn2=False):
        x = F.avg_pool2d(x, x.size()[2:])
        x = x.view(x.size(0), -1)
        feat = self.fc(x)
        if x2 is not None:
            x2 = F.avg_pool2d(x2, x2.size()[2:])
            x2 = x2.view(x2.size(0), -1)
            feat2 = self.fc(x2)
        if x2 is None:
            x = self.bn2(feat) if use_bn2 else self.bn(feat)
        else:
            x = self.bn(feat)
            x2 = self.bn2(feat2) if self.partner_bn else self.bn(feat2)
        if self.dropout > 0:
            x = self.drop(x)
        if x2 is not None:
            if self.dropout > 0:
                x2 = self.drop(x2)
            neck_feat1, neck_feat2 = x, x2
            x = (x + x2) / 2
        if need_feat:
            return x, neck_feat1, neck_feat2
        return x


# mllt/models/losses/resample_loss.py ResampleLoss with configs/voc head1.loss_cls: use_sigmoid, reweight
# 'rebalance', focal (balance_param 2, gamma 2), logit_reg (init_bias 0.05, neg_scale 5), map_param
# (alpha 0.1, beta 10, gamma 0.3); class_freq / neg_class_freq from the noisy training labels.


class RefResampleLoss:
    def __init__(self, class_freq, neg_class_freq, neg_scale=5.0, init_bias=0.05, map_alpha=0.1, map_beta=10.0,
                 map_gamma=0.3, balance_param=2.0, gamma=2):
        self.class_freq = torch.as_tensor(class_freq, dtype=torch.float32)
        neg_class_freq = torch.as_tensor(neg_class_freq, dtype=torch.float32)
        self.train_num = self.class_freq[0] + neg_class_freq[0]
        self.neg_scale, self.map_alpha, self.map_beta, self.map_gamma = neg_scale, map_alpha, map_beta, map_gamma
        self.balance_param, self.gamma = balance_param, gamma
        self.init_bias = -torch.log(self.train_num / self.class_freq - 1) * init_bias / neg_scale
        self.freq_inv = torch.ones(self.class_freq.shape) / self.class_freq

    def rebalance_weight(self, gt_labels):
        repeat_rate = torch.sum(gt_labels.float() * self.freq_inv, dim=1, keepdim=True)
        pos_weight = self.freq_inv.clone().detach().unsqueeze(0) / repeat_rate
        return torch.sigmoid(self.map_beta * (pos_weight - self.map_gamma)) + self.map_alpha

    def __call__(self, cls_score, label):  # reduction_override='none'
        weight = self.rebalance_weight(label.float())
        labels = label.float()
        logits = cls_score + self.init_bias  # [CL]: ``logits += self.init_bias``, in place on the head output
        logits = logits * (1 - labels) * self.neg_scale + logits * labels
        weight = weight / self.neg_scale * (1 - labels) + weight * labels
        logpt = -F.binary_cross_entropy_with_logits(logits.clone(), label.float(), reduction="none")
        pt = torch.exp(logpt)
        loss = F.binary_cross_entropy_with_logits(logits, label.float(), weight, reduction="none")
        loss = ((1 - pt) ** self.gamma) * loss
        return self.balance_param * loss


def ref_bce_loss(cls_score, label):
    """mllt/models/losses/bce_loss.py BCELoss with focal=False, reduction 'none' (head.loss_cls)."""
    return F.binary_cross_entropy_with_logits(cls_score, label.float(), None, reduction="none")


def ref_union_label(lb_a, lb_b):
    """mlltn/models/classifiers/utils.py union_label."""
    return torch.where((lb_a > 0) | (lb_b > 0), torch.ones_like(lb_a), torch.zeros_like(lb_a))


# mlltn/models/classifiers/stitchup.py StitchUpClassifier (+ the backbone's train() and tools/train.py's
# freeze_layer). Branch names are [CL]'s: 'random' and 'balance'.

MUTATIONS = ("union_negatives", "no_partner_bn", "thresholds_by_target", "peer_train_mode", "no_pseudo")


def ref_train_cfg(thresholds: dict) -> dict:
    """train_cfg of configs/voc/LT_dual_resnet50.py (every threshold off: alpha 1.0, beta 0.0, warmup_epoch 0)
    with the command-line values; [CL]'s ``random_*`` thresholds apply to the random branch's predictions."""
    cfg = {"warmup_epoch": 0}
    for ours, theirs in (("random", "random"), ("balanced", "balance")):
        for group in ("head", "medium", "tail"):
            cfg[f"{theirs}_{group}_alpha"] = thresholds[ours]["alpha"].get(group, 1.0)
            cfg[f"{theirs}_{group}_beta"] = thresholds[ours]["beta"].get(group, 0.0)
    return cfg


class RefStitchUpClassifier(nn.Module):
    def __init__(self, backbone, backbone1, neck, neck1, head, head1, loss_random, loss_balance, train_cfg,
                 class_split, tau=0.1, mutation=None):
        super().__init__()
        self.backbone, self.backbone1 = backbone, backbone1
        self.neck, self.neck1 = neck, neck1
        self.head, self.head1 = head, head1  # ClsHead(method='fc'): one nn.Linear
        self.loss_random, self.loss_balance = loss_random, loss_balance
        self.train_cfg = dict(train_cfg)
        self.tau = tau  # test_cfg.alpha
        self.epoch = 0
        self.mutation = mutation
        if mutation == "no_pseudo":
            self.train_cfg["warmup_epoch"] = 1  # [CL]'s switch: adjust_labels returns the noisy labels
        if mutation == "no_partner_bn":
            self.neck.partner_bn = self.neck1.partner_bn = False
        self.init_thresholds(class_split, head.out_features)

    def init_thresholds(self, split, num_classes):
        self.random_alphas, self.random_betas, self.balanced_alphas, self.balanced_betas = [], [], [], []
        for i in range(num_classes):
            if i in split["head"]:
                group = "head"
            elif i in split["middle"]:
                group = "medium"
            elif i in split["tail"]:
                group = "tail"
            else:
                raise Exception("wrong class split!")
            self.random_alphas.append(self.train_cfg[f"random_{group}_alpha"])
            self.random_betas.append(self.train_cfg[f"random_{group}_beta"])
            self.balanced_alphas.append(self.train_cfg[f"balance_{group}_alpha"])
            self.balanced_betas.append(self.train_cfg[f"balance_{group}_beta"])

    def train(self, mode=True):
        """ResNet.train: _freeze_stages() and norm_eval: every backbone BatchNorm back to eval mode."""
        super().train(mode)
        if mode:
            for bb in (self.backbone, self.backbone1):
                for m in bb.modules():
                    if isinstance(m, nn.modules.batchnorm._BatchNorm):
                        m.eval()
        return self

    def extract_feat(self, img, branch=None, use_bn2=False):
        x = self.backbone(img) if branch in (None, "random") else self.backbone1(img)
        return self.neck(x, use_bn2=use_bn2) if branch in (None, "random") else self.neck1(x, use_bn2=use_bn2)

    def extract_feat_stitchup(self, img1, img2, branch):
        if branch == "random":
            x1, x2 = self.backbone(img1), self.backbone(img2)
            return self.neck(x1, x2=x2, need_feat=True)
        x1, x2 = self.backbone1(img1), self.backbone1(img2)
        return self.neck1(x1, x2=x2, need_feat=True)

    def adjust_labels(self, noisy_labels, prob, branch):
        assert branch in ["random", "balance"]
        alphas = self.random_alphas if branch in ["random"] else self.balanced_alphas
        betas = self.random_betas if branch in ["random"] else self.balanced_betas
        new_labels = noisy_labels.clone()
        for i in range(noisy_labels.shape[1]):
            new_labels[:, i] = torch.where(prob[:, i] > alphas[i], torch.ones_like(new_labels[:, i]),
                                           new_labels[:, i])
            new_labels[:, i] = torch.where(prob[:, i] < betas[i], torch.zeros_like(new_labels[:, i]),
                                           new_labels[:, i])
        if self.epoch >= self.train_cfg["warmup_epoch"]:
            return new_labels
        return noisy_labels

    def forward_train(self, img, noisy_labels, img2, noisy_labels2, branch):
        """Returns the branch loss and its union targets."""
        x, x1, x2 = self.extract_feat_stitchup(img, img2, branch)
        head, peer_head = (self.head, self.head1) if branch == "random" else (self.head1, self.head)
        peer = "balance" if branch == "random" else "random"
        outs, outs1, outs2 = head(x), head(x1), head(x2)
        with torch.no_grad():
            if self.mutation != "peer_train_mode":
                self.neck1.eval()
                self.neck.eval()
            key = branch if self.mutation == "thresholds_by_target" else peer  # [CL]: the peer's thresholds
            prob1 = torch.sigmoid(peer_head(self.extract_feat(img, peer)))
            noisy_labels = self.adjust_labels(noisy_labels, prob1, key)
            prob1 = torch.sigmoid(peer_head(self.extract_feat(img2, peer)))
            noisy_labels2 = self.adjust_labels(noisy_labels2, prob1, key)
            self.neck.train()
            self.neck1.train()
        union_labels = ref_union_label(noisy_labels, noisy_labels2)
        loss_fn = self.loss_random if branch == "random" else self.loss_balance
        neg1, neg2 = (union_labels, union_labels) if self.mutation == "union_negatives" else (noisy_labels,
                                                                                              noisy_labels2)
        losses = loss_fn(outs, union_labels)
        losses1 = loss_fn(outs1, neg1)
        losses2 = loss_fn(outs2, neg2)
        loss = losses * (union_labels > 0).float() + (
            losses1 * (union_labels < 1).float() + losses2 * (union_labels < 1).float()) / 2
        return loss.mean(), union_labels

    def simple_test(self, img):
        """test_cfg dual=True: (ensemble, random, balance) logits."""
        outs_random = self.head(self.extract_feat(img))
        outs_balance = self.head1(self.extract_feat(img, branch="balance"))
        outs = self.tau * outs_random + (1 - self.tau) * outs_balance
        return outs, outs_random, outs_balance


def ref_freeze_layer(model):
    """tools/train.py -> mllt/apis/train.py freeze_layer: only parameters named head, neck or layer4 train."""
    for k, v in model.named_parameters():
        if "head" in k or "neck" in k or "layer4" in k:
            continue
        v.requires_grad = False
    return model


# mmcv 1.3.12: StepLrUpdaterHook (by_epoch) with linear warm-up, OptimizerHook with grad_clip, torch SGD


def ref_mmcv_lr(base_lr, epoch, cur_iter, step, gamma, warmup_iters, warmup_ratio):
    """before_train_epoch sets regular_lr = base_lr * gamma ** (#steps <= epoch); before_train_iter (runner.iter
    counted over all epochs) then sets the linear warm-up lr below warmup_iters, regular_lr at it, else keeps it."""
    exp = len(step)
    for i, s in enumerate(step):
        if epoch < s:
            exp = i
            break
    regular_lr = base_lr * gamma ** exp
    if cur_iter >= warmup_iters:
        return regular_lr
    k = (1 - cur_iter / warmup_iters) * (1 - warmup_ratio)
    return regular_lr * (1 - k)


def ref_clip_grads(params, max_norm):
    """OptimizerHook.clip_grads: parameters that train and have a gradient; torch's clip_grad_norm_ (L2)."""
    params = [p for p in params if p.requires_grad and p.grad is not None]
    total_norm = torch.sqrt(sum(p.grad.detach().pow(2).sum() for p in params))
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1:
        for p in params:
            p.grad.detach().mul_(clip_coef)
    return total_norm


def ref_sgd_step(params, state, lr, momentum, weight_decay):
    """torch.optim.SGD (dampening 0, no Nesterov): d = g + wd * p; buf = d on the first step, else
    momentum * buf + d; p -= lr * buf."""
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            d_p = p.grad + weight_decay * p
            if id(p) not in state:
                state[id(p)] = d_p.clone()
            else:
                state[id(p)].mul_(momentum).add_(d_p)
            p.add_(state[id(p)], alpha=-lr)


# ================================================================ the two sides on the same inputs


def noisy_labels(seed: int) -> torch.Tensor:
    """N_IMAGES x C noisy labels: every image and every class has a positive, no class is in every image."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(N_IMAGES, C, generator=g) < 0.3).float()
    y[torch.arange(N_IMAGES), torch.arange(N_IMAGES) % C] = 1
    y[-1] = 0
    y[-1, 0] = 1
    assert (y.sum(0) < N_IMAGES).all()
    return y


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory) -> str:
    """One pretrained-weights file for both branches, with non-trivial BatchNorm statistics."""
    from noisymlt.models.backbones import TinyResNet

    torch.manual_seed(3)
    net = TinyResNet()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    path = tmp_path_factory.mktemp("weights") / "tiny.pt"
    torch.save(net.state_dict(), path)
    return str(path)


@pytest.fixture(scope="module")
def paper_params() -> dict:
    return load_params(PROJECT / "params.yaml")


def project_model(params: dict, weights: str, seed: int):
    """The project's Ours (params.yaml's `ours` block on VOC, tiny backbone), with random heads wide enough
    for the pseudo labels to fire, distinct layer4 weights per branch, and non-trivial neck statistics."""
    cfg = resolve_run(params, "voc", "ours", 0.5, seed)
    cfg["train"].update(TRAIN, weights_path=weights)
    cfg["colearning"] = {"thresholds": THRESHOLDS}
    torch.manual_seed(seed)
    noisy = noisy_labels(seed)
    method = FAMILIES["colearning"](TrainContext(cfg, noisy, SPLIT, torch.device("cpu"), 1))
    model = method.build_model()
    assert model.shares_frozen_trunk and set(model.partner_bns) == {"random", "balanced"}
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for name, branch in model.branches.items():
            branch.head.fc.weight.normal_(0, 0.15, generator=g)
            branch.head.fc.bias.normal_(0, 0.5, generator=g)
            for p in branch.backbone.layer4.parameters():  # both start from one file: make them differ
                p.add_(0.05 * torch.randn(p.shape, generator=g))
            for bn in (branch.neck.bn, model.partner_bns[name]):
                bn.weight.uniform_(0.5, 1.5, generator=g)
                bn.bias.normal_(0, 0.2, generator=g)
                bn.running_mean.normal_(0, 0.5, generator=g)
                bn.running_var.uniform_(0.5, 2.0, generator=g)
    return method, model


def reference_model(method, model, mutation=None) -> RefStitchUpClassifier:
    """[CL]'s classifier on deep copies of the project's weights; [CL]'s freezing applied on its side."""
    r, b = model.branches["random"], model.branches["balanced"]
    counts = method.ctx.noisy.sum(0)
    ref = RefStitchUpClassifier(
        backbone=copy.deepcopy(r.backbone), backbone1=copy.deepcopy(b.backbone),
        neck=RefPFC(r.neck.fc, r.neck.bn, model.partner_bns["random"], dropout=0.0),  # config: neck dropout 0
        neck1=RefPFC(b.neck.fc, b.neck.bn, model.partner_bns["balanced"], dropout=0.5),  # neck1 dropout 0.5
        head=copy.deepcopy(r.head.fc), head1=copy.deepcopy(b.head.fc),
        loss_random=ref_bce_loss, loss_balance=RefResampleLoss(counts, N_IMAGES - counts),
        train_cfg=ref_train_cfg(THRESHOLDS),
        class_split={"head": SPLIT["head"], "middle": SPLIT["medium"], "tail": SPLIT["tail"]},
        tau=0.1, mutation=mutation)
    for p in ref.parameters():
        p.requires_grad_(True)
    return ref_freeze_layer(ref)


# project parameter / buffer names -> the reference's
NAME_MAP = (("branches.random.backbone.", "backbone."), ("branches.balanced.backbone.", "backbone1."),
            ("branches.random.neck.", "neck."), ("branches.balanced.neck.", "neck1."),
            ("partner_bns.random.", "neck.bn2."), ("partner_bns.balanced.", "neck1.bn2."),
            ("branches.random.head.fc.", "head."), ("branches.balanced.head.fc.", "head1."))


def ref_name(name: str) -> str:
    for ours, theirs in NAME_MAP:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    raise KeyError(name)


def step_batches(seed: int) -> dict:
    """Anchors and Stitch-Up partners (a partner shares a noisy class with its anchor), random images."""
    rng = np.random.default_rng(seed)
    y = noisy_labels(seed).numpy()
    g = torch.Generator().manual_seed(200 + seed)
    out = {}
    for name, size in BATCH.items():
        anchors = rng.choice(N_IMAGES, size, replace=False)
        partners = [rng.choice(np.flatnonzero(y[:, rng.choice(np.flatnonzero(y[a]))])) for a in anchors]
        out[name] = {"index": torch.tensor(np.stack([anchors, partners], axis=1)),
                     "images": torch.randn(size, 2, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g),
                     "stitched": torch.ones(size, dtype=torch.bool)}
    return out


@dataclass
class Step:
    loss: torch.Tensor
    branch_losses: dict[str, torch.Tensor]
    unions: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]  # keyed by the reference's names
    buffers: dict[str, torch.Tensor]


def run_project(method, model, batches, monkeypatch, seed: int) -> tuple[Step, dict]:
    unions = []
    real = family.stitchup_loss

    def recording(elementwise, stitched, singles, targets, **kw):
        unions.append(union_targets(targets).detach().clone())
        return real(elementwise, stitched, singles, targets, **kw)

    monkeypatch.setattr(family, "stitchup_loss", recording)
    model.train()
    torch.manual_seed(seed)  # dropout masks
    loss, logs = method.training_loss(model, batches, 0, 0)
    loss.backward()
    monkeypatch.setattr(family, "stitchup_loss", real)
    step = Step(loss.detach(), {n: logs[f"loss_{n}"] for n in ("random", "balanced")},
                dict(zip(("random", "balanced"), unions)),
                {ref_name(k): p.grad for k, p in model.named_parameters() if p.grad is not None},
                {ref_name(k): b.clone() for k, b in model.named_buffers()})
    return step, logs


def run_reference(ref, method, batches, seed: int) -> Step:
    """batch_processor: the random branch's forward_train, then the balanced branch's; loss = their sum."""
    ref.train()
    torch.manual_seed(seed)
    noisy = method.ctx.noisy
    losses, unions = {}, {}
    for ours, theirs in (("random", "random"), ("balanced", "balance")):
        b = batches[ours]
        img, img2 = b["images"][:, 0], b["images"][:, 1]
        losses[ours], unions[ours] = ref.forward_train(img, noisy[b["index"][:, 0]], img2, noisy[b["index"][:, 1]],
                                                       theirs)
    loss = losses["random"] + losses["balanced"]
    loss.backward()
    return Step(loss.detach(), {k: v.detach() for k, v in losses.items()}, unions,
                {k: p.grad for k, p in ref.named_parameters() if p.grad is not None},
                {k: b.clone() for k, b in ref.named_buffers()})


def mismatches(ours: Step, theirs: Step) -> list[str]:
    """What differs beyond the tolerance (an empty list: the step is [CL]'s)."""
    close = lambda a, b: a.shape == b.shape and torch.allclose(a.float(), b.float(), **TOL)  # noqa: E731
    out = []
    if not close(ours.loss, theirs.loss):
        out.append(f"total loss {ours.loss.item():.7f} vs {theirs.loss.item():.7f}")
    out += [f"loss of {n}" for n in ours.branch_losses if not close(ours.branch_losses[n], theirs.branch_losses[n])]
    out += [f"union targets of {n}" for n in ours.unions if not torch.equal(ours.unions[n], theirs.unions[n])]
    if ours.grads.keys() != theirs.grads.keys():
        out.append(f"trained parameters differ: {sorted(ours.grads.keys() ^ theirs.grads.keys())}")
    out += [f"gradient of {k}" for k in ours.grads.keys() & theirs.grads.keys()
            if not close(ours.grads[k], theirs.grads[k])]
    theirs_used = {k: v for k, v in theirs.buffers.items() if k in ours.buffers}
    if ours.buffers.keys() != theirs_used.keys():
        out.append(f"buffers differ: {sorted(ours.buffers.keys() ^ theirs_used.keys())}")
    out += [f"buffer {k}" for k in ours.buffers.keys() & theirs_used.keys()
            if not close(ours.buffers[k], theirs_used[k])]
    return out


def one_step(params, weights, monkeypatch, seed, mutation=None):
    method, model = project_model(params, weights, seed)
    ref = reference_model(method, model, mutation)
    before = {k: b.clone() for k, b in model.named_buffers()}
    batches = step_batches(seed)
    ours, logs = run_project(method, model, batches, monkeypatch, 10 + seed)
    theirs = run_reference(ref, method, batches, 10 + seed)
    return ours, theirs, logs, before


# ================================================================ tests


@pytest.mark.parametrize("seed", [0, 1])
def test_one_training_step_is_cl_forward_train(paper_params, tiny_weights, monkeypatch, seed):
    ours, theirs, logs, before = one_step(paper_params, tiny_weights, monkeypatch, seed)
    assert mismatches(ours, theirs) == []
    # the comparison covered what it claims: pseudo labels changed targets in both branches, the necks'
    # BatchNorms (anchor and partner) moved, the backbones' frozen BatchNorms did not, and only layer4,
    # necks and heads trained
    for name in ("random", "balanced"):
        assert int(logs[f"pl_added_{name}"]) + int(logs[f"pl_removed_{name}"]) > 0, name
    moved = {k for k in before if not torch.equal(before[k], ours.buffers[ref_name(k)])}
    assert {k.rsplit(".", 1)[0] for k in moved} == {
        "branches.random.neck.bn", "branches.balanced.neck.bn", "partner_bns.random", "partner_bns.balanced"}
    assert {k.split(".")[0] for k in ours.grads} == {"backbone", "backbone1", "neck", "neck1", "head", "head1"}
    assert all(".layer4." in k for k in ours.grads if k.startswith("backbone"))


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_step_check_sees_a_one_line_change(paper_params, tiny_weights, monkeypatch, mutation):
    ours, theirs, _, _ = one_step(paper_params, tiny_weights, monkeypatch, 0, mutation)
    found = mismatches(ours, theirs)
    assert found, f"the mutated reference ({mutation}) still matches the project"
    if mutation in ("thresholds_by_target", "no_pseudo", "union_negatives", "peer_train_mode"):
        assert any("loss" in m for m in found)
    if mutation == "no_partner_bn":  # the partner's batch statistics land in the anchor BatchNorm instead
        assert "buffer neck.bn2.running_mean" in found and "buffer neck.bn.running_mean" in found


@pytest.mark.parametrize("seed", [0, 1])
def test_ensemble_is_cl_simple_test(paper_params, tiny_weights, seed):
    method, model = project_model(paper_params, tiny_weights, seed)
    ref = reference_model(method, model).eval()
    model.eval()
    images = torch.randn(5, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        got = method.predict(model, images)
        outs, outs_random, outs_balance = ref.simple_test(images)
    assert method.tau == 0.1  # params.yaml's tau is [CL]'s test_cfg.alpha
    for head, expected in (("ensemble", outs), ("random", outs_random), ("balanced", outs_balance)):
        torch.testing.assert_close(got[head], expected, **TOL)
    # the weights are not symmetric: swapping the branches would be caught
    assert not torch.allclose(outs, 0.1 * outs_balance + 0.9 * outs_random, **TOL)


@pytest.mark.parametrize("warmup_iters, iters_per_epoch", [(100, 35), (500, 35), (100, 59)])
def test_lr_at_is_mmcv_step_schedule_with_linear_warmup(warmup_iters, iters_per_epoch):
    tcfg = {"lr": 0.02, "lr_gamma": 0.1, "lr_steps": [5, 7], "warmup_iters": warmup_iters,
            "warmup_ratio": 1.0 / 3}
    for epoch in range(8):
        for it in range(iters_per_epoch):
            expected = ref_mmcv_lr(0.02, epoch, epoch * iters_per_epoch + it, [5, 7], 0.1, warmup_iters, 1.0 / 3)
            assert lr_at(tcfg, epoch, it, iters_per_epoch) == pytest.approx(expected, rel=1e-12)
    assert lr_at(tcfg, 0, 0, iters_per_epoch) == pytest.approx(0.02 / 3, rel=1e-9)  # from lr * ratio


SGD_TRAIN = {"epochs": 2, "lr": 0.02, "lr_steps": [1], "lr_gamma": 0.1, "warmup_iters": 3, "warmup_ratio": 1.0 / 3,
             "momentum": 0.9, "weight_decay": 1e-4, "grad_clip": 35.0, "batch_size": 8, "balanced_batch_size": 8,
             "image_size": 16, "workers": 0, "loader": "pil", "backbone": "smallcnn", "weights_path": None,
             "trainable": "all", "frozen_bn": False, "cpu_threads": 1, "channels_last": False, "cpu_precision": "fp32",
             "new_layers_lr_mult": 1.0}  # [CL]'s one lr for every parameter (the demo's factor: tests/test_train.py)


def test_trainer_steps_are_mmcv_optimizer_hook_with_warmup(tiny_toy, tmp_path):
    """The Trainer's SGD steps (clip at 35, momentum, weight decay, warm-up lr by global iteration, on top
    of the epoch's step lr) replayed with mmcv's hooks on a copy of the initial weights. The loss itself is
    the project's (its equivalence with [CL] is tested above), on the same batches and dropout masks."""
    from noisymlt.training.trainer import Trainer

    params = load_params(PROJECT / "params.yaml", PROJECT / "workflow" / "profiles" / "demo" / "params.yaml")
    cfg = resolve_run(params, "toy", "ours", 0.5, 0)
    cfg["train"].update(SGD_TRAIN)
    trainer = Trainer(cfg, train_labels=tiny_toy["noisy"], test_labels=tiny_toy["test"], split=tiny_toy["split"],
                      train_images=tiny_toy["root"], test_images=tiny_toy["root"], out_dir=tmp_path / "run",
                      device="cpu", progress=False, limit_iters=2)
    with torch.no_grad():  # large neck outputs, so that the first gradients exceed the clipping norm
        for branch in trainer.model.branches.values():
            branch.neck.bn.weight.mul_(300.0)
    reference = copy.deepcopy(trainer.model)
    steps = []
    real_loss = trainer.method.training_loss

    def recording(model, batches, epoch, it):
        steps.append({"batches": {n: {k: v.clone() for k, v in b.items()} for n, b in batches.items()},
                      "rng": torch.get_rng_state(), "epoch": epoch, "it": it,
                      "lr": trainer.optimizer.param_groups[0]["lr"]})
        return real_loss(model, batches, epoch, it)

    trainer.method.training_loss = recording
    trainer.fit()
    assert [(s["epoch"], s["it"]) for s in steps] == [(0, 0), (0, 1), (1, 0), (1, 1)]

    state, norms = {}, []
    params_ref = list(reference.parameters())
    for k, s in enumerate(steps):  # runner.iter = k
        lr = ref_mmcv_lr(0.02, s["epoch"], k, [1], 0.1, 3, 1.0 / 3)
        assert s["lr"] == pytest.approx(lr, rel=1e-12), k
        reference.train()
        torch.set_rng_state(s["rng"])
        loss, _ = real_loss(reference, s["batches"], s["epoch"], s["it"])
        reference.zero_grad()
        loss.backward()
        norms.append(float(ref_clip_grads(params_ref, 35.0)))
        ref_sgd_step(params_ref, state, lr, 0.9, 1e-4)
    assert norms[0] > 35.0, norms  # clipping acted
    assert [s["lr"] for s in steps] == pytest.approx([0.02 / 3, 0.02 * 5 / 9, 0.002 * 7 / 9, 0.002], rel=1e-9)
    # Two implementations of the same steps sum in other orders (torch's foreach SGD and clipping against the
    # reference's loops), and the neck's x300 makes the first gradients large: on an AVX2-only CPU the head's
    # weights then differ by up to 1.6e-6 (AVX-512: under 1e-6). atol 1e-5 leaves a 6x margin on both; a reference
    # without momentum differs by up to 1.7e-2 (measured), far outside it.
    for (name, p), q in zip(trainer.model.named_parameters(), params_ref):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-5, msg=name)
