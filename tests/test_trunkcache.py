"""Trunk cache (train.trunk_cache_views): fixed views whose frozen-trunk outputs stand in for the images."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch

from conftest import interrupt_training, tiny_params, toy_trainer
from noisymlt.config import resolve_run, validate_params
from noisymlt.errors import NoisyMLTError
from noisymlt.tensoraug import augment
from noisymlt.trunkcache import TrunkCache, check_fixed, frozen_parts, frozen_parts_skipped

# The demo's backbone path: resnet_tiny from a weights file (random here), layer4 and the new layers train,
# BatchNorm frozen; fp32, so that the two paths agree to rounding.
FROZEN = {"backbone": "resnet_tiny", "pretrained": False, "trainable": "layer4", "frozen_bn": True,
          "cpu_precision": "fp32"}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from noisymlt.models.backbones import TinyResNet

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "tiny.pt"
    torch.save(TinyResNet().state_dict(), path)
    return str(path)


@pytest.fixture
def tiny_toy(tiny_toy, weights):
    """The conftest's tiny toy set, with the pretrained-weights file every branch loads."""
    return {**tiny_toy, "weights": weights}


def frozen(tiny_toy, **overrides) -> dict:
    return {**FROZEN, "weights_path": tiny_toy["weights"], **overrides}


def trunk_trainer(tiny_toy, out, method="erm", views=3, **overrides):
    params = tiny_params(method, **frozen(tiny_toy, trunk_cache_views=views, **overrides))
    return toy_trainer(tiny_toy, resolve_run(params, "toy", method, 0.5, 0), out)


def first_batches(trainer):
    """The first iteration's batches of every stream, on the device, as the training loop builds them."""
    from noisymlt.dataset import EpochPlan

    trainer.trunk = trainer.trunk_cache()
    dataset = trainer.train_dataset()
    raw = {}
    for stream in trainer.streams:
        slots = EpochPlan(stream, trainer.cfg["seed"], trainer.iters).batches(0)[0]
        raw[stream.name] = dataset.__getitems__(slots)
    return raw


def image_batch(trainer, raw):
    """The same batch with the views' images instead of their trunk outputs."""
    tcfg = trainer.cfg["train"]
    index, view = raw["index"], raw["view"]
    rows = torch.from_numpy(trainer.trunk.rows.array[index.flatten().numpy()]).permute(0, 3, 1, 2)
    params = torch.from_numpy(np.stack([trainer.trunk.image_views(i)[v]
                                        for i, v in zip(index.flatten().tolist(), view.flatten().tolist())]))
    images = augment(rows, params, tcfg["image_size"], tcfg["photometric"])
    return {"images": images.view(*index.shape, *images.shape[1:]), "index": index, "stitched": raw["stitched"]}


@pytest.mark.parametrize("method", ["erm", "ours", "mlgcn", "bbn"])
def test_a_step_on_cached_trunk_outputs_equals_the_step_on_the_views(tiny_toy, tmp_path, method):
    trainer = trunk_trainer(tiny_toy, tmp_path / "run", method)
    raw = first_batches(trainer)
    assert trainer.trunk is not None and trainer.trunk_status == "3 views"

    def step(batches, cached):
        trainer.model.zero_grad(set_to_none=True)
        with trainer.frozen_inputs() if cached else contextlib.nullcontext():
            loss, _ = trainer.method.training_loss(trainer.model, batches, 0, 0)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    fresh_loss, fresh_grads = step({n: trainer.to_device(image_batch(trainer, b)) for n, b in raw.items()}, False)
    torch.manual_seed(0)
    cached_loss, cached_grads = step({n: trainer.to_device(b) for n, b in raw.items()}, True)
    assert torch.allclose(cached_loss, fresh_loss, rtol=1e-5, atol=1e-6)
    assert cached_grads.keys() == fresh_grads.keys() and cached_grads
    for name in fresh_grads:
        assert torch.allclose(cached_grads[name], fresh_grads[name], rtol=1e-4, atol=1e-6), name
    # outside a training step the model runs whole again (test-time prediction reads images)
    assert all("forward" not in vars(part) for part in frozen_parts(trainer.model, "layer4"))


def test_views_are_fixed_per_image_and_the_cache_is_rebuilt_identically(tiny_toy, tmp_path):
    a = trunk_trainer(tiny_toy, tmp_path / "a", views=2)
    b = trunk_trainer(tiny_toy, tmp_path / "b", views=2)
    cache_a, cache_b = a.trunk_cache(), b.trunk_cache()
    assert torch.equal(cache_a.store, cache_b.store)  # what a resumed run rebuilds
    n = len(cache_a.rows)
    assert cache_a.store.shape[:2] == (n, 2)
    assert not torch.equal(cache_a.store[:, 0], cache_a.store[:, 1])  # two different augmentations
    assert np.array_equal(cache_a.image_views(5), cache_b.image_views(5))
    assert not np.array_equal(cache_a.image_views(5)[1], cache_a.image_views(5)[0])
    assert not np.array_equal(cache_a.image_views(5), cache_a.image_views(6))
    # a slot's view choice comes from its own seed: the same plan gives the same views
    va, vb = first_batches(a)["main"]["view"], first_batches(b)["main"]["view"]
    assert torch.equal(va, vb) and int(va.max()) < 2 and len(torch.unique(va)) == 2


def test_a_run_on_the_trunk_cache_trains_and_resumes_bit_identically(tiny_toy, tmp_path, monkeypatch):
    full = trunk_trainer(tiny_toy, tmp_path / "full", views=2)
    full.run()
    reference = np.load(tmp_path / "full" / "predictions.npz")["scores_main"]
    broken = trunk_trainer(tiny_toy, tmp_path / "resumed", views=2)
    interrupt_training(monkeypatch, broken, broken.iters + 2)
    trunk_trainer(tiny_toy, tmp_path / "resumed", views=2).run()
    manifest = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    assert manifest["trunk_cache"] == "2 views"
    np.testing.assert_array_equal(np.load(tmp_path / "resumed" / "predictions.npz")["scores_main"], reference)
    fresh = trunk_trainer(tiny_toy, tmp_path / "fresh", views=0)
    fresh.run()
    assert not np.array_equal(np.load(tmp_path / "fresh" / "predictions.npz")["scores_main"], reference)


@pytest.mark.parametrize("method, options, why", [
    ("dividemix", {}, "the method trains on pixels"),
    ("ours_mixup", {}, "the method trains on pixels"),
    ("ours_stitch_image_concat", {}, "the method trains on pixels"),
    ("erm", {"train": {"frozen_bn": False}}, "BatchNorm updates its statistics"),
    ("erm", {"train": {"trainable": "all"}}, "no stage is frozen"),
])
def test_runs_that_cannot_use_it_draw_fresh_views_and_say_why(tiny_toy, tmp_path, method, options, why):
    train = options.pop("train", {})
    params = tiny_params(method, **frozen(tiny_toy, trunk_cache_views=2, **train))
    params["methods"][method] = {**params["methods"][method], **options}
    trainer = toy_trainer(tiny_toy, resolve_run(params, "toy", method, 0.5, 0), tmp_path / "run")
    assert trainer.trunk_cache() is None
    assert trainer.trunk_status.startswith("not used") and why in trainer.trunk_status


def test_the_frozen_parts_must_be_one_fixed_function(tiny_toy, tmp_path):
    trainer = trunk_trainer(tiny_toy, tmp_path / "run", "ours")
    trainer.model.train()
    assert check_fixed(trainer.model, "layer4") is None
    parts = frozen_parts(trainer.model, "layer4")
    assert len(parts) == 2 * 4  # stem and layer1-3 of each branch's backbone
    with torch.no_grad():
        parts[-1][0].conv1.weight.add_(1.0)  # one branch's layer3 differs from the other's
    assert "differ in their frozen stages" in check_fixed(trainer.model, "layer4")
    with frozen_parts_skipped(trainer.model, "layer4"):
        assert all(part(torch.ones(1)) == 1 for part in parts)


def test_a_cache_too_large_is_refused_with_the_key(tiny_toy, tmp_path, monkeypatch):
    import noisymlt.trunkcache as tc

    monkeypatch.setattr(tc, "MAX_BYTES", 1000)
    with pytest.raises(NoisyMLTError, match="train.trunk_cache_views: 3 views of .* would hold"):
        trunk_trainer(tiny_toy, tmp_path / "run").trunk_cache()
    with pytest.raises(NoisyMLTError, match="at least 1"):
        TrunkCache(None, 0, 0, True, None, None, "cpu")


def test_views_are_validated():
    params = tiny_params("erm", trunk_cache_views=-1)
    with pytest.raises(Exception, match="trunk_cache_views"):
        validate_params(params)


def test_the_demo_profiles_views_were_measured_against_fresh_views():
    """The demo profile's trunk_cache_views rests on docs/demo_trunk_cache.json (scripts/experiment_trunk_cache.py):
    its V is among the measured ones, beside fresh views (V 0) on the same seeds, and it makes Ours' run cheaper."""
    from pathlib import Path

    from noisymlt.config import load_params, resolve_run

    repo = Path(__file__).resolve().parents[1]
    record = json.loads((repo / "docs" / "demo_trunk_cache.json").read_text())
    params = load_params(repo / "params.yaml", repo / "workflow" / "profiles" / "demo" / "params.yaml")
    views = resolve_run(params, "toy", "ours", 0.5, 0)["train"]["trunk_cache_views"]
    assert views > 0 and resolve_run(params, "toy", "erm", 0.5, 0)["train"]["trunk_cache_views"] == views
    for method in ("erm", "ours"):
        runs = record["runs"][method]
        assert f"v{views}" in runs and runs[f"v{views}"].keys() == runs["v0"].keys() and len(runs["v0"]) >= 2
    seconds = record["fit_cpu_seconds"]
    assert seconds[f"v{views}"]["ours"] < 0.6 * seconds["v0"]["ours"]
