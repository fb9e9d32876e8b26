"""Decoded-image cache: contents, index, refusals, tensor augmentation against the PIL reference, and
training with either loader."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import TINY_CACHE_SIZE, tiny_params, toy_trainer
from noisymlt.data.imagecache import build_cache, index_path, open_cache
from noisymlt.data.labels import read_labels, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.config import resolve_run
from noisymlt.training.augment import augment, draw_train_params, eval_resize
from noisymlt.data.sampling import EpochPlan, StreamSpec
from noisymlt.training.loaders import CachedEvalImages, CachedTrainImages, CacheRows, stream_loader
from noisymlt.training.transforms import eval_transform, random_crop_box, to_tensor, train_transform

GREY = float(np.mean(np.array([0.229, 0.224, 0.225]) * 255))  # one grey level in normalised units ~ 1 / GREY


def test_cache_rows_are_the_pil_decode_and_resize_of_each_image_in_table_order(tiny_toy):
    table = read_labels(tiny_toy["train"])
    arr = np.load(tiny_toy["train_cache"], mmap_mode="r")
    assert arr.shape == (len(table), TINY_CACHE_SIZE, TINY_CACHE_SIZE, 3) and arr.dtype == np.uint8
    for row in (0, 7, len(table) - 1):
        with Image.open(tiny_toy["root"] / table.paths[row]) as img:
            ref = np.asarray(img.convert("RGB").resize((TINY_CACHE_SIZE,) * 2, Image.BILINEAR))
        np.testing.assert_array_equal(arr[row], ref)
    index = json.loads(index_path(tiny_toy["train_cache"]).read_text())
    assert index["image_ids"] == list(table.image_ids) and index["paths"] == list(table.paths)
    assert index["size"] == TINY_CACHE_SIZE and index["count"] == len(table)
    assert index["source_sizes"][0] == [32, 32]


def test_noisy_copy_reads_the_subset_cache_and_a_stale_cache_is_refused(tiny_toy, tmp_path):
    noisy = read_labels(tiny_toy["noisy"])  # other labels, same rows: accepted
    open_cache(tiny_toy["train_cache"], labels=tiny_toy["noisy"], image_ids=noisy.image_ids, paths=noisy.paths,
               size=TINY_CACHE_SIZE)
    # a table with other rows (the subset redrawn): its sha256 and rows differ from the cache's
    other = tmp_path / "train.parquet"
    write_labels(noisy.subset(list(range(len(noisy)))[::-1]), other)
    t = read_labels(other)
    with pytest.raises(NoisyMLTError, match=r"train\.npy: stale image cache"):
        open_cache(tiny_toy["train_cache"], labels=other, image_ids=t.image_ids, paths=t.paths)
    with pytest.raises(NoisyMLTError, match="cache_size is 48"):
        open_cache(tiny_toy["train_cache"], labels=tiny_toy["noisy"], image_ids=noisy.image_ids,
                   paths=noisy.paths, size=48)
    with pytest.raises(NoisyMLTError, match="missing"):
        open_cache(tmp_path / "nothing.npy", labels=other, image_ids=t.image_ids, paths=t.paths)


def test_corrupt_image_is_named_and_no_cache_is_left(tiny_toy, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(tiny_toy["root"], root)
    victim = root / read_labels(tiny_toy["test"]).paths[3]
    victim.write_bytes(b"not a jpeg at all")
    out = tmp_path / "cache" / "test.npy"
    with pytest.raises(NoisyMLTError, match=victim.name):
        build_cache(tiny_toy["test"], root, 40, out, progress=False)
    assert not list((tmp_path / "cache").iterdir())  # neither the array nor its temporary copy


def test_cache_images_cli_writes_array_index_and_manifest(tiny_toy, tmp_path):
    from noisymlt.cli import main

    out = tmp_path / "c" / "test.npy"
    assert main(["cache-images", "--labels", str(tiny_toy["test"]), "--images", str(tiny_toy["root"]),
                 "--size", "36", "--out", str(out), "--no-progress"]) == 0
    assert np.load(out, mmap_mode="r").shape == (200, 36, 36, 3)
    manifest = json.loads((tmp_path / "c" / "test.manifest.json").read_text())
    assert manifest["step"] == "cache-images" and set(manifest["outputs"]) == {"array", "index"}


def _view(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()


def test_tensor_augmentation_follows_the_pil_reference_given_the_same_slot_seed(tiny_toy):
    """Same seed -> same crop box, photometric draw and flip in both paths; the only differences are
    resampling roundings (both resize to uint8 with antialias). Measured over 100 seeds: mean absolute
    difference ~0.02 grey levels, largest single pixel ~3.5 (a rounding step scaled by a contrast
    factor); asserted: mean < 0.1 and max < 6 grey levels, with the photometric distortion on."""
    arr = np.load(tiny_toy["train_cache"], mmap_mode="r")
    means, worst = [], 0.0
    for seed in range(100):
        img = np.array(arr[seed % len(arr)])
        ref = train_transform(Image.fromarray(img), 32, np.random.default_rng(seed), True)
        params = torch.from_numpy(draw_train_params(np.random.default_rng(seed), 40, 40, True)).unsqueeze(0)
        out = augment(_view(img), params, 32)[0]
        d = (out - ref).abs() * GREY
        means.append(float(d.mean()))
        worst = max(worst, float(d.max()))
    assert np.mean(means) < 0.1 and worst < 6.0
    # and the parameters really vary (a broken draw would make both paths trivially equal)
    boxes = {random_crop_box(40, 40, np.random.default_rng(s)) for s in range(20)}
    assert len(boxes) > 10


def test_fixed_crop_without_photometric_matches_and_eval_resize_matches_pil(tiny_toy):
    arr = np.load(tiny_toy["test_cache"], mmap_mode="r")
    img = np.array(arr[0])
    params = draw_train_params(np.random.default_rng(3), 40, 40, photometric=False)
    params[:4] = (0, 0, 40, 40)
    params[-1] = 0  # no flip
    out = augment(_view(img), torch.from_numpy(params).unsqueeze(0), 32, photometric_on=False)[0]
    ref = to_tensor(np.asarray(Image.fromarray(img).resize((32, 32), Image.BILINEAR), dtype=np.float32))
    assert float((out - ref).abs().max()) * GREY <= 1.01  # within one grey level (resize rounding)
    ev = eval_resize(_view(img), 32)[0]
    assert float((ev - eval_transform(Image.fromarray(img), 32)).abs().max()) * GREY <= 1.01
    # the full cache eval path (original -> 40 -> 32) against PIL's direct original -> 32: a second
    # resampling, not a rounding; on the toy's 32 px sources it stays within a few grey levels on average
    table = read_labels(tiny_toy["test"])
    with Image.open(tiny_toy["root"] / table.paths[0]) as src:
        direct = eval_transform(src.convert("RGB"), 32)
    assert float((ev - direct).abs().mean()) * GREY < 8.0


def _plan(n_images: int, seed: int = 0):
    class Uniform:
        def indices(self, epoch):
            return np.random.default_rng(epoch).permutation(n_images)

        def __len__(self):
            return n_images

    stream = StreamSpec("main", Uniform(), batch_size=8, k=2, p=0.5,
                        partner_fn=lambda a, rng: rng.integers(0, n_images, size=(len(a), 1)))
    return EpochPlan(stream, seed, iterations=3).batches(0)


def test_same_seed_same_batch_and_worker_count_does_not_matter(tiny_toy):
    rows = CacheRows(tiny_toy["train_cache"])
    batches = _plan(len(rows))
    data = CachedTrainImages(rows, 32, photometric=True)
    runs = [list(stream_loader(data, batches, workers, False)) for workers in (0, 0, 2)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a["images"], b["images"]) and torch.equal(a["index"], b["index"])
    assert runs[0][0]["images"].shape == (8, 2, 3, 32, 32)
    # the device route (uint8 + parameters, augmented after the transfer) gives the same tensors
    deferred = next(iter(stream_loader(CachedTrainImages(rows, 32, True, deferred=True), batches, 0, False)))
    assert deferred["images"].dtype == torch.uint8
    out = augment(deferred["images"].flatten(0, 1), deferred["aug"].flatten(0, 1), 32).view(8, 2, 3, 32, 32)
    torch.testing.assert_close(out, runs[0][0]["images"], rtol=0, atol=1e-5)
    ev = CachedEvalImages(rows, 32)
    assert ev[0].shape == (3, 32, 32) and CachedEvalImages(rows, 32, deferred=True)[0].dtype == torch.uint8


def test_loader_cache_requires_its_caches(tiny_toy, tmp_path):
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    assert resolved["train"]["loader"] == "cache"
    with pytest.raises(NoisyMLTError, match="--train-cache"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=None)


def test_short_runs_with_cache_and_pil_loaders_learn_alike(tiny_toy, tmp_path):
    from noisymlt.evaluation.evaluate import evaluate_predictions

    maps, ids = {}, set()
    for loader in ("cache", "pil"):
        resolved = resolve_run(tiny_params("erm", epochs=3, lr_steps=[3], loader=loader), "toy", "erm", 0.5, 0)
        trainer = toy_trainer(tiny_toy, resolved, tmp_path / loader)
        ids.add(trainer.run_id)
        trainer.run()
        result = evaluate_predictions(tmp_path / loader / "predictions.npz", tiny_toy["test"], tiny_toy["split"])
        maps[loader] = result["heads"]["main"]["map"]["total"]
        manifest = json.loads((tmp_path / loader / "manifest.json").read_text())
        assert ("train_cache" in manifest["inputs"]) == (loader == "cache")
    assert len(ids) == 2  # the loader is part of the run's configuration
    assert abs(maps["cache"] - maps["pil"]) < 0.08, maps
