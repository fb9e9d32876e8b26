#!/usr/bin/env python
"""Targeted experiment: why do BBN and ML-GCN fall far below ERM on the demo?

Trains BBN, ML-GCN and ERM on one noisy set of the demo (its configuration, its caches), each variant
changing ONE thing against the demo's run, and prints test mAP (total / head / medium / tail), the
training BCE against the noisy labels beside the prior-only BCE (noisymlt.training.fit_diagnostics) and the
training mAP against the noisy labels. Every variant says what it is: ``ref`` = what the reference code
does, ``regime`` = what the toy regime could lack, ``probe`` = neither, a control that isolates a part,
``fix`` = the demo's setting this experiment led to. "before" is the demo before it: BBN and ML-GCN trained every
parameter at the schedule's one lr (``train.new_layers_lr_mult`` / ``gcn_lr_mult`` 1); every variant but the "as
configured" rows changes one thing against that, so each of them runs with the new layers at the schedule's lr
(``train.new_layers_lr_mult: 1``), the regime this experiment started from; the demo has since raised that factor
for the recipes where it helps the fit (experiments/new_layer_lr/experiment_new_layer_lr.py), which "as configured" rows show.

Needs the demo's data (`snakemake --profile workflow/profiles/demo data/toy/noisy/g0.5_s0.parquet
data/toy/cache/train.npy data/toy/cache/test.npy data/pretrained/toy_glyphs.pt`). 15-30 CPU seconds a run.

    python experiments/bbn_mlgcn/experiment_bbn_mlgcn.py --json benchmarks/bbn_mlgcn.json [--only bbn]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def _nn():
    import torch
    from torch import nn

    return torch, nn


def neck_wrap(stage, in_dim: int, out_dim: int, dropout: float):
    """A BBN branch stage followed by [CL]'s neck (GAP -> fc -> BatchNorm -> dropout), its output shaped as a
    1 x 1 map so that BBNNet's GAP passes it through."""
    torch, nn = _nn()
    from noisymlt.models.heads import Neck

    class StageNeck(nn.Module):
        def __init__(self):
            super().__init__()
            self.stage, self.neck = stage, Neck(in_dim, out_dim, dropout)

        def forward(self, x):
            return self.neck(self.stage(x))[:, :, None, None]

    return StageNeck()


def bn_wrap(stage, dim: int):
    """A BBN branch stage followed by a BatchNorm over its GAP features (normalisation, no new layer)."""
    torch, nn = _nn()

    class StageBN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stage, self.bn = stage, nn.BatchNorm1d(dim)

        def forward(self, x):
            return self.bn(self.stage(x).mean(dim=(2, 3)))[:, :, None, None]

    return StageBN()


# ---------------------------------------------------------------- model edits (after the trainer built it)
def keep_new_bn_training(model):
    """BBNNet.train freezes every BatchNorm of its branch stages; the wrapped stages' own (new) BatchNorm
    must train, so only the backbone's parts are frozen."""
    torch, nn = _nn()
    from noisymlt.models.backbones import freeze_batchnorm

    def train(mode=True):
        nn.Module.train(model, mode)
        if mode and model.frozen_bn:
            freeze_batchnorm(model.shared, model.stage_c.stage, model.stage_r.stage)
        return model

    model.train = train


def bbn_neck(model, cfg):
    from noisymlt.models.heads import Head

    d, k = cfg["train"]["neck_dim"], model.classifier.fc.out_features
    model.stage_c = neck_wrap(model.stage_c, model.feat_dim, d, cfg["train"]["neck_dropout"])
    model.stage_r = neck_wrap(model.stage_r, model.feat_dim, d, cfg["train"]["neck_dropout"])
    model.classifier = Head(2 * d, k)
    keep_new_bn_training(model)


def bbn_bn(model, cfg):
    model.stage_c = bn_wrap(model.stage_c, model.feat_dim)
    model.stage_r = bn_wrap(model.stage_r, model.feat_dim)
    keep_new_bn_training(model)


def prior_bias(model, labels):
    torch, nn = _nn()
    freq = np.clip(labels.mean(0), 1e-3, 1 - 1e-3)
    with torch.no_grad():
        model.classifier.fc.bias.copy_(torch.as_tensor(np.log(freq / (1 - freq)), dtype=torch.float32))


def mlgcn_neck(model, cfg):
    """[CL]'s neck between the pooled features and the GCN classifiers (which then have neck_dim)."""
    torch, nn = _nn()
    from noisymlt.models.heads import Neck
    from noisymlt.models.mlgcn import LabelGCN

    d = cfg["train"]["neck_dim"]
    gcn = model.gcn
    model.gcn = LabelGCN(gcn.embeddings.cpu().numpy(), gcn.adjacency.cpu().numpy(), out_dim=d)
    model.neck = Neck(model.backbone.out_dim, d, cfg["train"]["neck_dropout"])
    model.neck.pool = (lambda maps: maps.amax(dim=(2, 3))) if model.pool == "max" else model.neck.pool

    def forward(x):
        return model.neck(model.backbone(x)) @ model.gcn().t()

    model.forward = forward


def mlgcn_bias(model, cfg):
    """A learned per-class bias on ML-GCN's logits (ML-GCN has none)."""
    torch, nn = _nn()
    model.bias = nn.Parameter(torch.zeros(model.gcn.adjacency.shape[0]))
    inner = type(model).forward

    def forward(x):
        return inner(model, x) + model.bias

    model.forward = forward


def mlgcn_linear(model, cfg):
    """The GCN replaced by a plain weight matrix (C, D), initialised as the project's Head: is it the graph?"""
    torch, nn = _nn()
    k, d = model.gcn.adjacency.shape[0], model.backbone.out_dim

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(k, d) * 0.01)

        def forward(self):
            return self.weight

    model.gcn = Plain()


def mlgcn_identity_graph(model, cfg):
    """The label graph replaced by the identity: each class's classifier from its own embedding only."""
    torch, nn = _nn()
    with torch.no_grad():
        model.gcn.adjacency.copy_(torch.eye(model.gcn.adjacency.shape[0]))


def erm_no_neck(model, cfg, pool="avg"):
    """ERM's neck replaced by plain pooling, its head then reads the raw 128-d features (as BBN / ML-GCN)."""
    torch, nn = _nn()
    from noisymlt.models.heads import Head

    class Pool(nn.Module):
        def forward(self, maps):
            return maps.amax(dim=(2, 3)) if pool == "max" else maps.mean(dim=(2, 3))

    model.neck = Pool()
    model.head = Head(model.backbone.out_dim, model.head.fc.out_features)


# ---------------------------------------------------------------- optimiser / sampler edits
def rebuild_optimizer(trainer, mults: dict | None = None):
    """A fresh SGD over the (edited) model's trainable parameters, grouped by the method's lr factors and
    ``mults`` (parameter-name prefix -> factor, taking precedence)."""
    from noisymlt.training.schedule import build_optimizer

    # as the Trainer builds them (its SGD, fused on CUDA, and the schedule of the new groups)
    trainer.optimizer, trainer.lr_schedule = build_optimizer(trainer.model, trainer.cfg["train"],
                                                             {**(mults or {}), **trainer.method.lr_multipliers()},
                                                             trainer.iters, trainer.device)


@contextlib.contextmanager
def bbn_uniform_rebalancing():
    """BBN's re-balancing stream drawn uniformly (another seed) instead of by the reversed sampler."""
    import noisymlt.methods.bbn as bbn

    real = bbn.build_sampler

    def fake(name, labels, seed, **kw):
        return real("random", labels, seed + 1000, **kw) if name == "reversed" else real(name, labels, seed, **kw)

    bbn.build_sampler = fake
    try:
        yield
    finally:
        bbn.build_sampler = real


def set_train(**kw):
    def edit(cfg):
        cfg["train"].update(kw)
    return edit


def set_method(**kw):
    def edit(cfg):
        cfg["method_cfg"].update(kw)
    return edit


def double_epochs(cfg):
    t = cfg["train"]
    t["epochs"] *= 2
    t["lr_steps"] = [2 * s for s in t["lr_steps"]]
    t["warmup_iters"] *= 2


def edits(*fns):
    def edit(cfg):
        for fn in fns:
            fn(cfg)
    return edit


# The demo before this experiment: one lr for every parameter of BBN and ML-GCN. Every variant below but the
# "as configured" rows starts from it and changes one thing.
BEFORE = {"bbn": set_train(new_layers_lr_mult=1.0), "mlgcn": set_method(gcn_lr_mult=1.0)}

# name: (method, kind, config edit, context, model edit, lr factors by parameter prefix, test-time alpha for BBN)
VARIANTS = {
    "erm: as configured": ("erm", "-", None, None, None, None, None),
    "erm: no neck (head on raw GAP features)": ("erm", "probe", None, None, erm_no_neck, None, None),
    "erm: no neck, head lr x10": ("erm", "probe", None, None, erm_no_neck, {"head.": 10.0}, None),
    "erm: lr 0.08": ("erm", "regime", set_train(lr=0.08), None, None, None, None),
    "erm: lr 0.2": ("erm", "regime", set_train(lr=0.2), None, None, None, None),
    "erm: 2x epochs": ("erm", "regime", double_epochs, None, None, None, None),
    "erm: every stage trained": ("erm", "regime", set_train(trainable="all"), None, None, None, None),
    "bbn: as configured": ("bbn", "fix", None, None, None, None, None),
    "bbn: before (one lr, test alpha 0.5)": ("bbn", "ref", BEFORE["bbn"], None, None, None, None),
    "bbn: before, test alpha 1 (conventional half)": ("bbn", "probe", BEFORE["bbn"], None, None, None, 1.0),
    "bbn: before, test alpha 0 (re-balancing half)": ("bbn", "probe", BEFORE["bbn"], None, None, None, 0.0),
    "bbn: uniform re-balancing stream": ("bbn", "probe", BEFORE["bbn"], bbn_uniform_rebalancing, None, None, None),
    "bbn: split_at block": ("bbn", "ref", edits(BEFORE["bbn"], set_method(split_at="block")), None, None, None,
                            None),
    "bbn: neck per branch": ("bbn", "regime", BEFORE["bbn"], None, bbn_neck, None, None),
    "bbn: BatchNorm on features": ("bbn", "regime", BEFORE["bbn"], None, bbn_bn, None, None),
    "bbn: bias at prior logits": ("bbn", "regime", BEFORE["bbn"], None, "prior_bias", None, None),
    "bbn: lr 0.08": ("bbn", "regime", edits(BEFORE["bbn"], set_train(lr=0.08)), None, None, None, None),
    "bbn: lr 0.2": ("bbn", "regime", edits(BEFORE["bbn"], set_train(lr=0.2)), None, None, None, None),
    "bbn: 2x epochs": ("bbn", "regime", edits(BEFORE["bbn"], double_epochs), None, None, None, None),
    "bbn: classifier lr x10": ("bbn", "regime", edits(BEFORE["bbn"], set_train(new_layers_lr_mult=10.0)), None,
                               None, None, None),
    "mlgcn: as configured": ("mlgcn", "ref", None, None, None, None, None),
    "mlgcn: before (one lr)": ("mlgcn", "-", BEFORE["mlgcn"], None, None, None, None),
    "mlgcn: avg pool": ("mlgcn", "probe", edits(BEFORE["mlgcn"], set_method(pool="avg")), None, None, None, None),
    "mlgcn: adjacency paper": ("mlgcn", "ref", edits(BEFORE["mlgcn"], set_method(adjacency="paper")), None, None,
                               None, None),
    "mlgcn: identity graph": ("mlgcn", "probe", BEFORE["mlgcn"], None, mlgcn_identity_graph, None, None),
    "mlgcn: linear classifier (no GCN)": ("mlgcn", "probe", BEFORE["mlgcn"], None, mlgcn_linear, None, None),
    "mlgcn: learned bias": ("mlgcn", "regime", BEFORE["mlgcn"], None, mlgcn_bias, None, None),
    "mlgcn: neck": ("mlgcn", "regime", BEFORE["mlgcn"], None, mlgcn_neck, None, None),
    "mlgcn: lr 0.08": ("mlgcn", "regime", edits(BEFORE["mlgcn"], set_train(lr=0.08)), None, None, None, None),
    "mlgcn: lr 0.2": ("mlgcn", "regime", edits(BEFORE["mlgcn"], set_train(lr=0.2)), None, None, None, None),
    "mlgcn: 2x epochs": ("mlgcn", "regime", edits(BEFORE["mlgcn"], double_epochs), None, None, None, None),
    "mlgcn: GCN lr x10": ("mlgcn", "ref", edits(BEFORE["mlgcn"], set_method(gcn_lr_mult=10.0)), None, None, None,
                          None),
    "mlgcn: backbone lr x0.1 (GCN at lr)": ("mlgcn", "ref", BEFORE["mlgcn"], None, None, {"backbone.": 0.1}, None),
    "mlgcn: ML-GCN's lrs (GCN 0.1, backbone 0.01)": ("mlgcn", "ref", edits(BEFORE["mlgcn"], set_train(lr=0.01),
                                                                           set_method(gcn_lr_mult=10.0)),
                                                       None, None, None, None),
}


def feature_geometry(trainer) -> dict:
    """The pretrained backbone's GAP features of the training images (test transform), before any training:
    their norm, and the share of their second moment along the top direction (the mean, for non-negative
    features): a linear classifier's slow directions learn at about 1 / that ratio of its fast one."""
    torch, nn = _nn()
    rng = torch.get_rng_state()  # the run that follows must not notice
    feats = []
    hook = trainer.model.backbone.register_forward_hook(lambda m, i, o: feats.append(o.float().mean(dim=(2, 3))))
    trainer.predict(part="train")
    hook.remove()
    torch.set_rng_state(rng)
    f = torch.cat(feats).double().numpy()
    second = np.linalg.eigvalsh(f.T @ f / len(f))[::-1]
    centred = np.linalg.eigvalsh(np.cov(f.T))[::-1]
    return {"dim": f.shape[1], "mean_norm": round(float(np.linalg.norm(f, axis=1).mean()), 2),
            "mean_entry": round(float(f.mean()), 3),
            "top_share_of_second_moment": round(float(second[0] / second.sum()), 3),
            "centred_top_over_20th_eigenvalue": round(float(centred[0] / centred[19]), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="file to write every variant's numbers to")
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="variant name prefixes to run (default: all)")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    import torch

    from noisymlt.data.labels import read_class_split, read_labels
    from noisymlt.evaluation.metrics import average_precisions
    from noisymlt.config import load_params, resolve_run
    from noisymlt.pipeline.paths import image_root
    from noisymlt.training.trainer import Trainer

    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    data = REPO / "data" / "toy"
    images = REPO / image_root(params, "toy", "train")
    test = read_labels(data / "test_labels.parquet")
    split = read_class_split(data / "class_split.json")
    cols = {g: list(split[g]) for g in ("head", "medium", "tail")}
    out_path = Path(args.json)
    saved = json.loads(out_path.read_text()) if out_path.exists() else {}
    out, geometry = saved.get("runs", {}), saved.get("features")
    chosen = [n for n in VARIANTS if args.only is None or any(n.startswith(p) for p in args.only)]
    trained: dict = {}  # (method, config edit) -> its trainer without model edits (test-alpha variants reuse it)
    with tempfile.TemporaryDirectory() as scratch:
        for k, name in enumerate(chosen):
            method, kind, cfg_edit, context, model_edit, mults, test_alpha = VARIANTS[name]
            t0 = resource.getrusage(resource.RUSAGE_SELF)
            if test_alpha is not None and (method, cfg_edit) in trained:
                trainer = trained[(method, cfg_edit)]
                trainer.method.predict = lambda model, x, a=test_alpha: {"main": model(x, alpha=a)}
                history = trainer.history
            else:
                cfg = copy.deepcopy(resolve_run(params, "toy", method, args.gamma, args.seed))
                if not name.endswith("as configured"):  # the regime this experiment started from (docstring)
                    cfg["train"]["new_layers_lr_mult"] = 1.0
                if cfg_edit:
                    cfg_edit(cfg)
                with context() if context else contextlib.nullcontext():
                    trainer = Trainer(cfg, train_labels=data / "noisy" / f"g{args.gamma:g}_s{args.seed}.parquet",
                                      test_labels=data / "test_labels.parquet", split=data / "class_split.json",
                                      train_images=images, test_images=images, out_dir=Path(scratch) / str(k),
                                      device="cpu", progress=False, train_cache=data / "cache" / "train.npy",
                                      test_cache=data / "cache" / "test.npy")
                    if geometry is None and name == "erm: as configured":  # before it trains
                        geometry = feature_geometry(trainer)
                        print(f"raw GAP features of the pretrained backbone: {geometry}", flush=True)
                    if model_edit == "prior_bias":
                        prior_bias(trainer.model, trainer.train_table.labels)
                    elif model_edit:
                        model_edit(trainer.model, cfg)
                    if model_edit or mults:
                        trainer.model.to(memory_format=torch.channels_last)
                        rebuild_optimizer(trainer, mults)
                    history = trainer.fit()
                trainer.history = history
                if model_edit is None and mults is None and context is None:
                    trained[(method, cfg_edit)] = trainer
                if test_alpha is not None:
                    trainer.method.predict = lambda model, x, a=test_alpha: {"main": model(x, alpha=a)}
            scores = trainer.predict()
            fit = trainer.fit_record(history, scores)
            head = next(iter(scores))
            ap_c = average_precisions(test.labels, scores[head])
            t1 = resource.getrusage(resource.RUSAGE_SELF)
            row = {"method": method, "kind": kind,
                   "test_map": round(100 * float(np.nanmean(ap_c)), 2),
                   **{f"test_map_{g}": round(100 * float(np.nanmean(ap_c[c])), 2) for g, c in cols.items()},
                   "prior_bce": fit["prior_bce"], **fit["heads"][head],
                   "final_loss": history[-1].get("loss"),
                   "cpu_s": round(t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime, 1)}
            out[name] = row
            print(f"{name:45s} [{kind:6s}] mAP {row['test_map']:5.2f} (h {row['test_map_head']:5.2f} "
                  f"m {row['test_map_medium']:5.2f} t {row['test_map_tail']:5.2f})  train BCE "
                  f"{row['train_bce']:.3f} / prior {row['prior_bce']:.3f}  train mAP {100 * row['train_map']:5.1f}"
                  f"  test p05-p95 {row['test_score_p05']:.2f}-{row['test_score_p95']:.2f}  cpu {row['cpu_s']}s",
                  flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps({"gamma": args.gamma, "seed": args.seed, "features": geometry,
                                            "runs": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
