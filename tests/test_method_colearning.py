"""Ours (Stitch-Up + Heterogeneous Co-Learning, family `colearning`): model wiring, pseudo labels,
options, and short end-to-end runs on a tiny toy dataset."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from noisymlt import cli
from noisymlt.data.labels import read_labels, write_class_split
from noisymlt.errors import NoisyMLTError
from noisymlt.methods import FAMILIES, TrainContext
from noisymlt.methods import colearning as family
from noisymlt.models.twobranch import ensemble_logits
from noisymlt.config import load_params, resolve_run, validate_params
from noisymlt.data.sampling import EpochPlan

PROJECT = Path(__file__).resolve().parents[1]
C = 6
SPLIT = {"head": [0, 1], "medium": [2, 3], "tail": [4, 5]}
SMALL_TRAIN = {"image_size": 16, "batch_size": 4, "balanced_batch_size": 6, "workers": 0,
               # a scratch backbone that trains whole: these tests follow gradients into every part
               "backbone": "smallcnn", "weights_path": None, "trainable": "all", "frozen_bn": False}

# A few of the method blocks proposed for params.yaml (the ablations are options of one family).
BLOCKS = {
    "ours": {},
    "ours_no_stitchup": {"stitchup": {"enabled": False}},
    "ours_no_pseudo": {"pseudo": {"source": "none"}},
    "ours_self": {"pseudo": {"source": "self"}},
    "ours_shared_backbone": {"shared_backbone": True},
    "ours_stitch_feature_concat": {"stitchup": {"mode": "feature_concat"}, "pseudo": {"source": "none"}},
    "ours_stitch_image_concat": {"stitchup": {"mode": "image_concat"}, "pseudo": {"source": "none"}},
    "ours_mixup": {"stitchup": {"enabled": False}, "mixup": {"enabled": True, "alpha": 1.0},
                   "pseudo": {"source": "none"}},
    "ours_single_balanced_stitchup": {"branches": {"balanced": {}}, "pseudo": {"source": "none"}},
    "ours_rr_cross": {"branches": {"random": {}, "balanced": {"sampler": "random"}}},
    "ours_k3": {"stitchup": {"k": 3, "partner_bn": False}, "pseudo": {"source": "none"}},
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is as fast, and far faster on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_params() -> dict:
    return load_params(PROJECT / "params.yaml", PROJECT / "workflow" / "profiles" / "demo" / "params.yaml")


def params_with(base: dict, blocks: dict) -> dict:
    params = copy.deepcopy(base)
    for name, opts in blocks.items():
        params["methods"][name] = {"family": "colearning", "label": name, **opts}
    return params


def resolved(base: dict, opts: dict, *, dataset: str = "toy", train: dict | None = None) -> dict:
    cfg = resolve_run(params_with(base, {"m": opts}), dataset, "m", 0.5, 0)
    cfg["train"].update(train or SMALL_TRAIN)
    return cfg


def noisy_labels(n: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    y = (torch.rand(n, C, generator=g) < 0.35).float()
    y[torch.arange(n), torch.arange(n) % C] = 1  # every image and every class has a positive
    return y


def make_method(base: dict, opts: dict, **kw):
    torch.manual_seed(0)
    ctx = TrainContext(resolved(base, opts, **kw), noisy_labels(), SPLIT, torch.device("cpu"), 2)
    method = FAMILIES["colearning"](ctx)
    return method, method.build_model()


def make_batches(method, seed: int = 0, size: int = 16) -> dict:
    """One step's batches: the real stream plans (indices, partners, stitched flags), random pixels."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for spec in method.streams():
        items = EpochPlan(spec, 0, 1).batches(0)[0]
        index = torch.tensor([ids for ids, _, _ in items])
        out[spec.name] = {"images": torch.randn(*index.shape, 3, size, size, generator=g), "index": index,
                          "stitched": torch.tensor([s for _, _, s in items])}
    return out


# ---------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize("name", ["ours", "ours_no_stitchup", "ours_stitch_feature_concat", "ours_stitch_image_concat",
                                  "ours_mixup", "ours_k3", "ours_self", "ours_single_balanced_stitchup"])
def test_forward_backward_every_mode(base_params, name):
    method, model = make_method(base_params, BLOCKS[name])
    model.train()
    loss, logs = method.training_loss(model, make_batches(method), 0, 0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    names = list(method.specs)
    assert float(logs["loss"]) == pytest.approx(sum(float(logs[f"loss_{n}"]) for n in names), rel=1e-6)
    loss.backward()
    for n in names:  # every part of every branch that the step uses receives a gradient
        branch = model.branches[n]
        for part in (branch.backbone, branch.neck.fc, branch.neck.bn, branch.head):
            assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in part.parameters())
        assert branch.head.fc.weight.grad.abs().sum() > 0
    partner_bn = method.stitch["enabled"] and method.stitch["mode"] == "feature_average" and method.stitch["partner_bn"]
    assert sorted(model.partner_bns) == (sorted(names) if partner_bn else [])
    for bn in model.partner_bns.values():
        assert bn.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["ours", "ours_stitch_image_concat", "ours_mixup"])
def test_mixed_precision_step(base_params, name):
    """The GPU path runs under autocast: half-precision logits must still give a float32 loss."""
    method, model = make_method(base_params, BLOCKS[name])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, logs = method.training_loss(model, make_batches(method), 0, 0)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(model.branches["random"].head.fc.weight.grad).all()


def test_stream_shapes_and_partners(base_params):
    method, _ = make_method(base_params, {"stitchup": {"k": 3, "p": 0.5}},
                            train={**SMALL_TRAIN, "batch_size": 5, "balanced_batch_size": 7})
    streams = {s.name: s for s in method.streams()}
    assert {n: (s.batch_size, s.k, s.p) for n, s in streams.items()} == {"random": (5, 3, 0.5), "balanced": (7, 3, 0.5)}
    assert type(streams["random"].sampler).__name__ == "RandomSampler"
    assert type(streams["balanced"].sampler).__name__ == "ClassAwareSampler"
    noisy = noisy_labels().numpy()
    anchors = np.arange(24)
    partners = streams["random"].partner_fn(anchors, np.random.default_rng(0))
    assert partners.shape == (24, 2)
    for a, ps in zip(anchors, partners):  # all partners share one noisy class with the anchor
        assert (noisy[a] * noisy[ps].min(axis=0)).sum() >= 1
    # p = 0.5: about half of the slots are stitched
    items = EpochPlan(streams["balanced"], 0, 40).batches(0)
    stitched = [s for batch in items for _, _, s in batch]
    assert 0.35 < np.mean(stitched) < 0.65


def test_same_sampler_kind_gets_a_different_stream(base_params):
    method, _ = make_method(base_params, BLOCKS["ours_rr_cross"])
    a, b = (s.sampler for s in method.streams())
    assert type(a).__name__ == type(b).__name__ == "RandomSampler"
    assert a.seed == 0 and b.seed != 0  # the first keeps the run seed (same stream as ERM)
    assert not np.array_equal(a.indices(0), b.indices(0))


def test_feature_average_stitch_uses_partner_batchnorm(base_params, monkeypatch):
    """The stitched logits are head((neck(anchor) + neck'(partner)) / 2), neck' = the neck with the
    partner BatchNorm; targets are the per-view labels; the loss gets the stitched mask."""
    method, model = make_method(base_params, BLOCKS["ours_no_pseudo"])
    with torch.no_grad():  # make the partner BatchNorm differ from the anchor's
        model.partner_bns["random"].weight.fill_(2.0)
        model.partner_bns["random"].bias.fill_(0.5)
    seen = {}

    def spy(elementwise, stitched, singles, targets, *, mask, negatives):
        singles = [s.detach() for s in singles]
        seen.setdefault("calls", []).append((stitched.detach(), singles, targets, mask, negatives))
        return stitched.sum() * 0

    monkeypatch.setattr(family, "stitchup_loss", spy)
    batches = make_batches(method)
    model.train()
    method.training_loss(model, batches, 0, 0)
    stitched, singles, targets, mask, negatives = seen["calls"][0]  # random branch: dropout 0, deterministic
    b = batches["random"]
    f = model.branches["random"]
    with torch.no_grad():
        maps = f.backbone(b["images"].flatten(0, 1)).unflatten(0, b["index"].shape)
        anchor = f.neck(maps[:, 0])
        partner = model.partner_bns["random"](f.neck.fc(f.neck.pool(maps[:, 1])))
    torch.testing.assert_close(singles[0], f.head(anchor))
    torch.testing.assert_close(singles[1], f.head(partner))
    torch.testing.assert_close(stitched, f.head((anchor + partner) / 2))
    assert not torch.allclose(partner, f.neck(maps[:, 1]))  # a different BatchNorm than the anchor's
    torch.testing.assert_close(targets[1], noisy_labels()[b["index"][:, 1]])
    assert mask.tolist() == b["stitched"].tolist() and negatives == "own"
    union, _ = make_method(base_params, {"stitchup": {"negatives": "union"}, "pseudo": {"source": "none"}})
    union.training_loss(model, batches, 0, 0)
    assert seen["calls"][-1][4] == "union"


def set_fixed_logits(branch, logits: list[float]) -> None:
    """Make a branch predict the same logits for every image."""
    with torch.no_grad():
        branch.head.fc.weight.zero_()
        branch.head.fc.bias.copy_(torch.tensor(logits))


def capture_targets(monkeypatch) -> list:
    seen = []

    def spy(elementwise, stitched, singles, targets, *, mask, negatives):
        seen.append([t.clone() for t in targets])
        return stitched.sum() * 0

    monkeypatch.setattr(family, "stitchup_loss", spy)
    return seen


# VOC defaults (toy uses them): source alpha 0.7 on head {0, 1}, beta 0.1 on tail {4, 5}
FIXED = [6.0, -6.0, -6.0, 6.0, -6.0, 6.0]  # q = .998 / .002 per class


def corrected_by_fixed(y: torch.Tensor) -> torch.Tensor:
    out = y.clone()
    out[..., 0] = 1  # head, q > 0.7
    out[..., 4] = 0  # tail, q < 0.1
    return out  # class 1 (head, q low: no beta on head), 2/3 (medium: off), 5 (tail, q high: no alpha on tail)


def test_cross_pseudo_labels_come_from_the_peer(base_params, monkeypatch):
    method, model = make_method(base_params, BLOCKS["ours"])
    set_fixed_logits(model.branches["balanced"], FIXED)
    seen = capture_targets(monkeypatch)
    batches = make_batches(method)
    model.train()
    _, logs = method.training_loss(model, batches, 0, 0)
    noisy = noisy_labels()
    random_targets, balanced_targets = seen
    for k in range(2):
        expected = corrected_by_fixed(noisy[batches["random"]["index"][:, k]])
        torch.testing.assert_close(random_targets[k], expected)
        # the random branch (head init N(0, 0.01): q ~ 0.5) corrects nothing in the balanced branch
        torch.testing.assert_close(balanced_targets[k], noisy[batches["balanced"]["index"][:, k]])
    y = noisy[batches["random"]["index"]]  # all rows stitched (p = 1): every view counts
    assert int(logs["pl_added_random"]) == int((y[..., 0] == 0).sum())
    assert int(logs["pl_removed_random"]) == int((y[..., 4] == 1).sum())
    assert int(logs["pl_added_balanced"]) == int(logs["pl_removed_balanced"]) == 0
    # the peer predicted in eval mode: its neck BatchNorm counted only its own training batch
    assert int(model.branches["balanced"].neck.bn.num_batches_tracked) == 1
    assert model.branches["balanced"].neck.training and model.branches["balanced"].head.training


def test_self_pseudo_labels_come_from_the_branch_itself(base_params, monkeypatch):
    method, model = make_method(base_params, BLOCKS["ours_self"])
    set_fixed_logits(model.branches["balanced"], FIXED)
    seen = capture_targets(monkeypatch)
    batches = make_batches(method)
    model.train()
    method.training_loss(model, batches, 0, 0)
    noisy = noisy_labels()
    random_targets, balanced_targets = seen
    for k in range(2):
        torch.testing.assert_close(random_targets[k], noisy[batches["random"]["index"][:, k]])
        torch.testing.assert_close(balanced_targets[k], corrected_by_fixed(noisy[batches["balanced"]["index"][:, k]]))


def test_no_pseudo_labels_keeps_the_noisy_targets(base_params, monkeypatch):
    method, model = make_method(base_params, BLOCKS["ours_no_pseudo"])
    for n in ("random", "balanced"):
        set_fixed_logits(model.branches[n], FIXED)
    seen = capture_targets(monkeypatch)
    batches = make_batches(method)
    _, logs = method.training_loss(model, batches, 0, 0)
    noisy = noisy_labels()
    for name, targets in zip(("random", "balanced"), seen):
        torch.testing.assert_close(targets[1], noisy[batches[name]["index"][:, 1]])
    assert not any(k.startswith("pl_") for k in logs)


def test_pseudo_labels_carry_no_gradient_into_the_peer(base_params):
    method, model = make_method(base_params, BLOCKS["ours"])
    batches = make_batches(method)
    loss, _ = method._branch_loss(model, "random", batches["random"], 0, 0, 0)
    loss.backward()
    assert all(p.grad is None for p in model.branches["balanced"].parameters())
    assert model.branches["random"].head.fc.weight.grad is not None


def test_unstitched_partners_are_not_counted(base_params):
    method, model = make_method(base_params, BLOCKS["ours"])
    set_fixed_logits(model.branches["balanced"], FIXED)
    batches = make_batches(method)
    b = batches["random"]
    b["stitched"] = torch.tensor([True, False, False, False])
    _, logs = method._branch_loss(model, "random", b, 0, 0, 0)
    y = noisy_labels()[b["index"]]
    used = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 0]], dtype=torch.bool)
    assert int(logs["pl_added_random"]) == int(((y[..., 0] == 0) & used).sum())


def test_ensemble_is_tau_weighted(base_params):
    method, model = make_method(base_params, BLOCKS["ours"])
    model.eval()
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    heads = method.predict(model, x)
    assert list(heads) == ["ensemble", "random", "balanced"] == list(method.heads)
    f, g = model.branches["random"](x), model.branches["balanced"](x)
    torch.testing.assert_close(heads["random"], f)
    torch.testing.assert_close(heads["balanced"], g)
    torch.testing.assert_close(heads["ensemble"], 0.1 * f + 0.9 * g)
    torch.testing.assert_close(ensemble_logits(torch.ones(2), torch.zeros(2), 0.25), torch.full((2,), 0.25))


def test_single_branch_reports_main(base_params):
    method, model = make_method(base_params, BLOCKS["ours_single_balanced_stitchup"])
    assert method.heads == ("main",) and list(model.branches) == ["balanced"]
    assert [s.name for s in method.streams()] == ["balanced"]
    model.eval()
    x = torch.randn(2, 3, 16, 16)
    heads = method.predict(model, x)
    assert list(heads) == ["main"]
    torch.testing.assert_close(heads["main"], model.branches["balanced"](x))


def count_backbone_calls(model) -> dict:
    """Forward passes per distinct backbone, counted from now on."""
    calls = {}
    for branch in model.branches.values():
        key = id(branch.backbone)
        if key not in calls:
            calls[key] = 0
            branch.backbone.register_forward_hook(lambda *_, key=key: calls.__setitem__(key, calls[key] + 1))
    return calls


def test_shared_backbone_really_shares(base_params):
    _, separate = make_method(base_params, BLOCKS["ours"])
    method, shared = make_method(base_params, BLOCKS["ours_shared_backbone"])
    assert shared.branches["random"].backbone is shared.branches["balanced"].backbone
    n_backbone = sum(p.numel() for p in shared.branches["random"].backbone.parameters())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731  (parameters() de-duplicates)
    assert count(separate) - count(shared) == n_backbone
    # one backbone pass per stream: the peer's pseudo labels reuse the maps
    calls = count_backbone_calls(shared)
    loss, _ = method.training_loss(shared, make_batches(method), 0, 0)
    assert list(calls.values()) == [2]
    loss.backward()
    # both branches' losses reach the shared weights: the gradient is the sum of the two
    grad_total = shared.branches["random"].backbone.body[0].weight.grad.clone()
    shared.zero_grad()
    loss_r, _ = method._branch_loss(shared, "random", make_batches(method)["random"], 0, 0, 0)
    loss_r.backward()
    assert not torch.allclose(grad_total, shared.branches["random"].backbone.body[0].weight.grad)
    shared.eval()
    calls = count_backbone_calls(shared)
    method.predict(shared, torch.randn(2, 3, 16, 16))
    assert list(calls.values()) == [1]  # prediction: both heads from one pass


def test_separate_backbones_run_the_peer_on_the_other_stream(base_params):
    method, model = make_method(base_params, BLOCKS["ours"])
    calls = count_backbone_calls(model)
    method.training_loss(model, make_batches(method), 0, 0)
    assert list(calls.values()) == [2, 2]  # own stream + the peer's pseudo labels on the other stream


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("opts, where", [
    ({"stitchup": {"modes": "feature_average"}}, "stitchup"),
    ({"colearn": True}, ""),
    ({"branches": {"random": {"sampler": "random", "lr": 1}, "balanced": {}}}, "branches.random"),
    ({"branches": {"random": {}, "third": {}}}, "branches"),
    ({"mixup": {"enabled": True}}, ""),  # Stitch-Up is on by default
    ({"mixup": {"enabled": True}, "stitchup": {"enabled": True}}, "stitchup.enabled"),
    ({"stitchup": {"k": 1}}, "stitchup.k"),
    ({"stitchup": {"k": 6}}, "stitchup.k"),
    ({"stitchup": {"p": 1.5}}, "stitchup.p"),
    ({"stitchup": {"mode": "cutmix"}}, "stitchup.mode"),
    ({"pseudo": {"source": "peer"}}, "pseudo.source"),
    ({"pseudo": {"thresholds": {"random": {"alpha": {"body": 0.5}}}}}, "pseudo.thresholds"),
    ({"branches": {"balanced": {}}}, ""),  # one branch has no peer: cross (the default) is refused
    ({"branches": {"balanced": {}}, "pseudo": {"source": "cross"}}, "pseudo.source"),
])
def test_options_schema_rejects(base_params, opts, where):
    params = params_with(base_params, {"m": opts})
    # the key path in the schema's message (an unknown key named in it), or the key named by a cross-field
    # rule's clearer one
    pattern = rf"methods\.m{re.escape('.' + where) if where else ''}[.:]|methods\.m: colearning options: .*{where}"
    with pytest.raises(NoisyMLTError, match=pattern):
        validate_params(params)


def test_options_accepted_and_cross_field_messages(base_params):
    validate_params(params_with(base_params, {f"m_{n}": o for n, o in BLOCKS.items()}))
    with pytest.raises(NoisyMLTError, match="mixup.enabled and stitchup.enabled are exclusive"):
        make_method(base_params, {"mixup": {"enabled": True}})
    with pytest.raises(NoisyMLTError, match="'cross' needs two branches"):
        make_method(base_params, {"branches": {"random": {}}})
    with pytest.raises(NoisyMLTError, match=r"methods\.m\.stitchup\.k"):  # a run config bypassing params.yaml
        make_method(base_params, {"stitchup": {"k": 9}})


def test_branch_defaults_and_overrides(base_params):
    method, model = make_method(base_params, {"branches": {"random": {"dropout": 0.2, "loss": "focal"},
                                                           "balanced": {"batch_size": "random"}}},
                                train={**SMALL_TRAIN, "batch_size": 3, "balanced_batch_size": 9})
    r, b = method.specs["random"], method.specs["balanced"]
    assert (r.sampler, r.loss, r.batch_size, r.dropout) == ("random", "focal", 3, 0.2)
    assert (b.sampler, b.loss, b.batch_size, b.dropout) == ("class_aware", "db_focal", 3, 0.5)
    assert model.branches["balanced"].neck.drop.p == 0.5
    assert type(method.losses["random"]).__name__ == "FocalLoss"


def test_thresholds_defaults_and_overrides(base_params):
    method, _ = make_method(base_params, {})
    alpha, beta = method.thresholds["balanced"]  # toy uses VOC's: alpha 0.7 head, beta 0.1 tail
    assert alpha.tolist() == [0.7, 0.7, 1, 1, 1, 1] and beta.tolist() == [0, 0, 0, 0, 0.1, 0.1]
    cfg = resolved(base_params, {})
    cfg["kind"] = "coco"
    coco = FAMILIES["colearning"](TrainContext(cfg, noisy_labels(), SPLIT, torch.device("cpu"), 2))
    assert coco.thresholds["random"][0].tolist() == [0.9, 0.9, 1, 1, 1, 1]
    assert coco.thresholds["random"][1].tolist() == [0.0] * C
    own = {"random": {"alpha": {"medium": 0.8}}}
    method, _ = make_method(base_params, {"pseudo": {"thresholds": own}})
    assert method.thresholds["random"][0].tolist() == [1, 1, 0.8, 0.8, 1, 1]
    assert method.thresholds["balanced"][0].tolist() == [1.0] * C  # a source not listed is off
    cfg = resolved(base_params, {})
    cfg["colearning"] = {"thresholds": {"balanced": {"beta": {"tail": 0.3}}}}
    ds = FAMILIES["colearning"](TrainContext(cfg, noisy_labels(), SPLIT, torch.device("cpu"), 2))
    assert ds.thresholds["balanced"][1].tolist() == [0, 0, 0, 0, 0.3, 0.3]
    cfg["colearning"] = {"alpha": 0.7}
    with pytest.raises(NoisyMLTError, match=r"datasets\.toy\.colearning: unknown key"):
        FAMILIES["colearning"](TrainContext(cfg, noisy_labels(), SPLIT, torch.device("cpu"), 2))


# ---------------------------------------------------------------------------------------------- training runs
@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict:
    """160 train / 60 test toy images at 32 px, noisy labels at gamma 0.5, a head/medium/tail split by count."""
    d = tmp_path_factory.mktemp("colearning_toy")
    run = lambda *argv: cli.main([str(a) for a in argv])  # noqa: E731
    assert run("make-toy", "--out", d, "--n-trainval", 160, "--n-test", 60, "--size", 32) == 0
    root = d / "VOCdevkit" / "TOY"
    for image_set, out in (("trainval", "clean.parquet"), ("test", "test.parquet")):
        assert run("parse", "--format", "voc", "--source", root, "--image-set", image_set, "--out", d / out) == 0
    assert run("noise", "--labels", d / "clean.parquet", "--gamma", 0.5, "--seed", 0, "--out", d / "noisy.parquet") == 0
    order = np.argsort(-read_labels(d / "clean.parquet").labels.sum(0), kind="stable").tolist()
    write_class_split({"head": order[:4], "medium": order[4:10], "tail": order[10:]}, d / "split.json")
    return {"dir": d, "root": root}


TOY_TRAIN = {"epochs": 1, "batch_size": 16, "balanced_batch_size": 16, "image_size": 16, "workers": 0, "loader": "pil",
             "warmup_iters": 2, "eval_batch_size": 64, "backbone": "smallcnn", "weights_path": None,
             "trainable": "all", "frozen_bn": False}


def train_run(base_params, toy, name: str, out: str):
    from noisymlt.training.trainer import Trainer

    cfg = resolve_run(params_with(base_params, {name: BLOCKS[name]}), "toy", name, 0.5, 0)
    cfg["train"].update(TOY_TRAIN)
    d = toy["dir"]
    trainer = Trainer(cfg, train_labels=d / "noisy.parquet", test_labels=d / "test.parquet", split=d / "split.json",
                      train_images=toy["root"], test_images=toy["root"], out_dir=d / out, device="cpu",
                      progress=False)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.run()
    return trainer, before, d / out


@pytest.fixture(scope="module")
def runs(base_params, toy):
    """Trainer runs by (method, copy), each trained once per module."""
    cache = {}

    def get(name: str, copy_tag: str = "a"):
        if (name, copy_tag) not in cache:
            cache[name, copy_tag] = train_run(base_params, toy, name, f"run_{name}_{copy_tag}")
        return cache[name, copy_tag]

    return get


@pytest.mark.parametrize("name", ["ours", "ours_stitch_image_concat", "ours_mixup", "ours_single_balanced_stitchup"])
def test_trainer_runs(runs, name):
    trainer, before, out = runs(name)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and trainer.iters == 10
    branches = list(trainer.method.specs)
    assert all(np.isfinite(log[0][f"loss_{n}"]) and log[0][f"loss_{n}"] > 0 for n in branches)
    if trainer.method.source != "none":
        assert {f"pl_added_{n}" for n in branches} <= set(log[0])
    after = trainer.model.state_dict()
    for n in branches:
        for part in ("head.fc.weight", "neck.fc.weight", "backbone.body.0.weight"):
            key = f"branches.{n}.{part}"
            assert not torch.equal(before[key], after[key]), key
    pred = np.load(out / "predictions.npz")
    assert list(pred["heads"]) == list(trainer.method.heads)
    for head in pred["heads"]:
        s = pred[f"scores_{head}"]
        assert s.shape == (60, 20) and np.isfinite(s).all() and (s >= 0).all() and (s <= 1).all()


def test_two_cpu_runs_give_identical_predictions(runs):
    outs = [runs("ours", tag)[2] for tag in ("a", "b")]
    a, b = (np.load(out / "predictions.npz") for out in outs)
    for head in ("ensemble", "random", "balanced"):
        assert np.array_equal(a[f"scores_{head}"], b[f"scores_{head}"])
    logs = [json.loads((out / "train_log.jsonl").read_text()) for out in outs]
    for log in logs:
        del log["seconds"]
    assert logs[0] == logs[1]


# ---------------------------------------------------------------- the shared frozen trunk
@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory) -> str:
    """One pretrained-weights file for both branches (any weights: only their equality matters)."""
    from noisymlt.models.backbones import TinyResNet

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "tiny.pt"
    net = TinyResNet()
    for m in net.modules():  # non-trivial BatchNorm statistics, so that frozen BN is really exercised
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    torch.save(net.state_dict(), path)
    return str(path)


PRETRAINED_TRAIN = {**SMALL_TRAIN, "backbone": "resnet_tiny", "weights_path": None, "trainable": "layer4",
                    "frozen_bn": True}


def stem_calls(model) -> list[int]:
    calls = [0]
    for branch in model.branches.values():
        branch.backbone.stem.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("name", ["ours", "ours_no_pseudo", "ours_stitch_feature_concat", "ours_self", "ours_mixup"])
def test_shared_frozen_trunk_gives_the_unshared_losses_and_gradients(base_params, tiny_weights, name):
    train = {**PRETRAINED_TRAIN, "weights_path": tiny_weights}
    results = {}
    for shared in (True, False):
        method, model = make_method(base_params, BLOCKS[name] if name in BLOCKS else {"pseudo": {"source": "none"}},
                                    train=train)
        assert model.shares_frozen_trunk
        model.shares_frozen_trunk = shared  # the unshared path: each branch runs its own copy
        model.train()
        calls = stem_calls(model)
        torch.manual_seed(0)
        loss, _ = method.training_loss(model, make_batches(method), 0, 0)
        loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results[shared] = (loss.detach(), grads, calls[0])
    (l_on, g_on, calls_on), (l_off, g_off, calls_off) = results[True], results[False]
    torch.testing.assert_close(l_on, l_off, rtol=1e-5, atol=1e-6)
    assert g_on.keys() == g_off.keys() and g_on
    for k in g_on:
        torch.testing.assert_close(g_on[k], g_off[k], rtol=1e-5, atol=1e-6)
    # frozen-trunk passes per step: shared, once per stream; unshared, the peer's pass on the other
    # stream's views runs it again (Mix-Up's mixed images are seen once either way)
    assert (calls_on, calls_off) == {"ours": (2, 4), "ours_mixup": (2, 2)}.get(name, (2, 2))


def test_shared_frozen_trunk_switches_itself_off(base_params, tiny_weights):
    with_weights = {**PRETRAINED_TRAIN, "weights_path": tiny_weights}
    assert make_method(base_params, {}, train=with_weights)[1].shares_frozen_trunk
    for change in ({"weights_path": None},  # random initialisation: two different frozen trunks
                   {"trainable": "all"}, {"frozen_bn": False}):
        assert not make_method(base_params, {}, train={**with_weights, **change})[1].shares_frozen_trunk, change
    shared = make_method(base_params, {"shared_backbone": True}, train=with_weights)[1]
    assert not shared.shares_frozen_trunk  # one backbone already: its maps are reused as they are
    single = make_method(base_params, {"branches": {"balanced": {}}, "pseudo": {"source": "none"}}, train=with_weights)
    assert not single[1].shares_frozen_trunk


def test_prediction_runs_the_shared_frozen_trunk_once(base_params, tiny_weights):
    method, model = make_method(base_params, {}, train={**PRETRAINED_TRAIN, "weights_path": tiny_weights})
    model.eval()
    images = torch.randn(6, 3, 32, 32)
    out = {}
    for shared in (True, False):
        model.shares_frozen_trunk = shared
        calls = stem_calls(model)
        with torch.no_grad():
            out[shared] = (method.predict(model, images), calls[0])
        for branch in model.branches.values():
            branch.backbone.stem._forward_hooks.clear()
    (on, calls_on), (off, calls_off) = out[True], out[False]
    assert (calls_on, calls_off) == (1, 2)
    for head in ("ensemble", "random", "balanced"):
        torch.testing.assert_close(on[head], off[head], rtol=1e-5, atol=1e-6)
