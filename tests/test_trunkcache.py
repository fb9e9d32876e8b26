"""Trunk cache (train.trunk_cache_views): fixed views whose frozen-trunk outputs stand in for the images."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil

import numpy as np
import pytest
import torch

from helpers import interrupt_training, tiny_params, toy_trainer
from noisymlt.errors import NoisyMLTError
from noisymlt.config import resolve_run, validate_params
from noisymlt.training.augment import augment
from noisymlt.training.trunkcache import TrunkCache, check_fixed, frozen_parts, frozen_parts_skipped

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


@pytest.fixture(scope="module")
def tiny_toy(tiny_toy, weights):
    """The conftest's tiny toy set, with the pretrained-weights file every branch loads."""
    return {**tiny_toy, "weights": weights}


def frozen(tiny_toy, **overrides) -> dict:
    return {**FROZEN, "weights_path": tiny_toy["weights"], **overrides}


def trunk_trainer(tiny_toy, out, method="erm", views=3, seed=0, **overrides):
    params = tiny_params(method, **frozen(tiny_toy, trunk_cache_views=views, **overrides))
    return toy_trainer(tiny_toy, resolve_run(params, "toy", method, 0.5, seed), out)


def own_cache(tiny_toy, folder):
    """``tiny_toy`` reading a copy of its train image cache in ``folder``: its memo folder (folder/trunk) is
    this test's own."""
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".npy", ".json"):
        shutil.copy(tiny_toy["train_cache"].with_suffix(suffix), folder / f"train{suffix}")
    return {**tiny_toy, "train_cache": folder / "train.npy"}


STATUS = re.compile(r"(\d+) views \(memo ([0-9a-f]{20})\)")


def memo_file(trainer):
    """The memo file the trainer's trunk cache was loaded from or saved to (its status names the key)."""
    return trainer.caches["train"].parent / "trunk" / f"{STATUS.fullmatch(trainer.images.trunk_status).group(2)}.pt"


def first_batches(trainer):
    """The first iteration's batches of every stream, on the device, as the training loop builds them."""
    from noisymlt.data.sampling import EpochPlan

    trainer.open_trunk()
    dataset = trainer.images.train_dataset()
    raw = {}
    for stream in trainer.streams:
        slots = EpochPlan(stream, trainer.cfg["seed"], trainer.iters).batches(0)[0]
        raw[stream.name] = dataset.__getitems__(slots)
    return raw


def image_batch(trainer, raw):
    """The same batch with the views' images instead of their trunk outputs."""
    tcfg = trainer.cfg["train"]
    index, view = raw["index"], raw["view"]
    rows = torch.from_numpy(trainer.images.trunk.rows.array[index.flatten().numpy()]).permute(0, 3, 1, 2)
    params = torch.from_numpy(np.stack([trainer.images.trunk.image_views(i)[v]
                                        for i, v in zip(index.flatten().tolist(), view.flatten().tolist())]))
    images = augment(rows, params, tcfg["image_size"], tcfg["photometric"])
    return {"images": images.view(*index.shape, *images.shape[1:]), "index": index, "stitched": raw["stitched"]}


@pytest.mark.parametrize("method", ["erm", "ours", "mlgcn", "bbn"])
def test_a_step_on_cached_trunk_outputs_equals_the_step_on_the_views(tiny_toy, tmp_path, method):
    trainer = trunk_trainer(tiny_toy, tmp_path / "run", method)
    raw = first_batches(trainer)
    assert trainer.images.trunk is not None and STATUS.fullmatch(trainer.images.trunk_status).group(1) == "3"

    def step(batches, cached):
        trainer.model.zero_grad(set_to_none=True)
        with trainer.images.frozen_inputs(trainer.model) if cached else contextlib.nullcontext():
            loss, _ = trainer.method.training_loss(trainer.model, batches, 0, 0)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    fresh_loss, fresh_grads = step({n: trainer.images.to_device(image_batch(trainer, b)) for n, b in raw.items()}, False)
    torch.manual_seed(0)
    cached_loss, cached_grads = step({n: trainer.images.to_device(b) for n, b in raw.items()}, True)
    assert torch.allclose(cached_loss, fresh_loss, rtol=1e-5, atol=1e-6)
    assert cached_grads.keys() == fresh_grads.keys() and cached_grads
    for name in fresh_grads:
        assert torch.allclose(cached_grads[name], fresh_grads[name], rtol=1e-4, atol=1e-6), name
    # outside a training step the model runs whole again (test-time prediction reads images)
    assert all("forward" not in vars(part) for part in frozen_parts(trainer.model, "layer4"))


def test_views_are_fixed_per_image_and_the_cache_is_rebuilt_identically(tiny_toy, tmp_path):
    a = trunk_trainer(tiny_toy, tmp_path / "a", views=2)
    b = trunk_trainer(tiny_toy, tmp_path / "b", views=2)
    cache_a, cache_b = a.open_trunk(), b.open_trunk()
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
    toy = own_cache(tiny_toy, tmp_path / "cache")  # the interrupted run computes the views, the resumed one loads them
    broken = trunk_trainer(toy, tmp_path / "resumed", views=2)
    interrupt_training(monkeypatch, broken, broken.iters + 2)
    resumed = trunk_trainer(toy, tmp_path / "resumed", views=2)
    resumed.run()
    assert (broken.images.trunk_memo, resumed.images.trunk_memo) == ("computed", "loaded")
    manifest = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    assert manifest["trunk_cache"] == full.images.trunk_status and STATUS.fullmatch(manifest["trunk_cache"])
    np.testing.assert_array_equal(np.load(tmp_path / "resumed" / "predictions.npz")["scores_main"], reference)
    fresh = trunk_trainer(tiny_toy, tmp_path / "fresh", views=0)
    fresh.run()
    assert not np.array_equal(np.load(tmp_path / "fresh" / "predictions.npz")["scores_main"], reference)


def test_a_second_run_loads_the_memo_and_trains_bit_identically(tiny_toy, tmp_path):
    """The first run computes the views' outputs and saves them; a run of the same configuration loads them;
    with the memo folder emptied a run computes them again: the three runs are the same, bit for bit."""
    toy = own_cache(tiny_toy, tmp_path / "cache")
    runs = {}
    for name in ("cold", "loaded", "emptied"):
        if name == "emptied":
            shutil.rmtree(tmp_path / "cache" / "trunk")
        trainer = trunk_trainer(toy, tmp_path / name, views=2)
        trainer.run()
        timing = json.loads((tmp_path / name / "manifest.timing.json").read_text())
        assert timing["trunk_cache"] == trainer.images.trunk_memo == ("loaded" if name == "loaded" else "computed")
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        runs[name] = manifest, np.load(tmp_path / name / "predictions.npz")["scores_main"]
        assert memo_file(trainer).is_file()
    cold, cold_scores = runs["cold"]
    assert [p.name for p in (tmp_path / "cache" / "trunk").iterdir()] == [memo_file(trainer).name]  # no temp file
    for name in ("loaded", "emptied"):
        manifest, scores = runs[name]
        # the manifest (a tracked output) says which memo, not whether this execution computed or loaded it
        assert manifest["trunk_cache"] == cold["trunk_cache"]
        assert manifest["history"] == cold["history"]  # every epoch's losses
        assert manifest["checkpoint_content_sha256"] == cold["checkpoint_content_sha256"]
        np.testing.assert_array_equal(scores, cold_scores)


def test_the_memo_key_covers_what_the_views_depend_on(tiny_toy, tmp_path):
    """Another seed, V, frozen weights, image cache or code gives another memo; another lr (the same views) the
    same."""
    from noisymlt.models.backbones import TinyResNet

    toy = own_cache(tiny_toy, tmp_path / "cache")

    def key(toy=toy, code=None, **options):
        trainer = trunk_trainer(toy, tmp_path / "run", **{"views": 2, **options})
        if code:  # as if the trainer's closure (trunk cache, augmentation, backbones) had been edited
            trainer.trunk_code = code
        trainer.open_trunk()
        return STATUS.fullmatch(trainer.images.trunk_status).group(2), trainer.images.trunk_memo

    base, how = key()
    assert how == "computed" and key(lr=0.123) == (base, "loaded")
    torch.manual_seed(1)
    other_weights = tmp_path / "other.pt"
    torch.save(TinyResNet().state_dict(), other_weights)
    others = [key(seed=1), key(views=3), key(weights_path=str(other_weights)), key(code="0123456789abcdef")]
    pixels = own_cache(tiny_toy, tmp_path / "other_cache")  # the same rows, one pixel changed
    rows = np.load(pixels["train_cache"], mmap_mode="r+")
    rows[0, 0, 0, 0] ^= 1
    rows.flush()
    del rows
    others.append(key(toy=pixels))
    assert all(how == "computed" for _, how in others)
    assert len({base, *(k for k, _ in others)}) == 1 + len(others)


@pytest.mark.parametrize("damage, why", [("truncated", "unreadable"), ("flipped byte", "do not match the digest"),
                                         ("another key", "written for key")])
def test_a_damaged_memo_is_reported_computed_again_and_replaced(tiny_toy, tmp_path, caplog, damage, why):
    toy = own_cache(tiny_toy, tmp_path / "cache")
    clean = trunk_trainer(toy, tmp_path / "clean", views=2)
    clean.run()
    path = memo_file(clean)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2:]
    elif damage == "flipped byte":  # inside the stored tensor: the file still loads
        data[len(data) // 2] ^= 1
    else:  # the memo of another configuration under this name
        other = trunk_trainer(toy, tmp_path / "other", views=3)
        other.open_trunk()
        data = bytearray(memo_file(other).read_bytes())
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="noisymlt.training.trunkcache"):
        again = trunk_trainer(toy, tmp_path / "again", views=2)
        again.run()
    assert again.images.trunk_memo == "computed" and f"{path}: unusable trunk-cache memo, " in caplog.text
    assert why in caplog.text
    assert again.images.trunk_status == clean.images.trunk_status
    np.testing.assert_array_equal(np.load(tmp_path / "again" / "predictions.npz")["scores_main"],
                                  np.load(tmp_path / "clean" / "predictions.npz")["scores_main"])
    caplog.clear()
    replaced = trunk_trainer(toy, tmp_path / "replaced", views=2)
    assert torch.equal(replaced.open_trunk().store, again.images.trunk.store)
    assert replaced.images.trunk_memo == "loaded" and "unusable" not in caplog.text


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
    assert trainer.open_trunk() is None
    assert trainer.images.trunk_status.startswith("not used") and why in trainer.images.trunk_status


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
    import noisymlt.training.trunkcache as tc

    monkeypatch.setattr(tc, "MAX_BYTES", 1000)
    with pytest.raises(NoisyMLTError, match="train.trunk_cache_views: 3 views of .* would hold"):
        trunk_trainer(tiny_toy, tmp_path / "run").open_trunk()
    with pytest.raises(NoisyMLTError, match="at least 1"):
        TrunkCache(None, 0, 0, True, None, None, "cpu")


def test_views_are_validated():
    params = tiny_params("erm", trunk_cache_views=-1)
    with pytest.raises(Exception, match="trunk_cache_views"):
        validate_params(params)


def test_the_demo_profiles_views_were_measured_against_fresh_views():
    """The demo profile's trunk_cache_views rests on experiments/trunk_cache/result.json (experiments/trunk_cache/experiment_trunk_cache.py):
    its V is among the measured ones, beside fresh views (V 0) on the same seeds, and it makes Ours' run cheaper."""
    from pathlib import Path

    from noisymlt.config import load_params, resolve_run

    repo = Path(__file__).resolve().parents[1]
    record = json.loads((repo / "experiments" / "trunk_cache" / "result.json").read_text())
    params = load_params(repo / "params.yaml", repo / "workflow" / "profiles" / "demo" / "params.yaml")
    views = resolve_run(params, "toy", "ours", 0.5, 0)["train"]["trunk_cache_views"]
    assert views > 0 and resolve_run(params, "toy", "erm", 0.5, 0)["train"]["trunk_cache_views"] == views
    for method in ("erm", "ours"):
        runs = record["runs"][method]
        assert f"v{views}" in runs and runs[f"v{views}"].keys() == runs["v0"].keys() and len(runs["v0"]) >= 2
    seconds = record["fit_cpu_seconds"]
    assert seconds[f"v{views}"]["ours"] < 0.6 * seconds["v0"]["ours"]
