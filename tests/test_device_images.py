"""Training images on the device (noisymlt.training.device_images): its augmentation against the loader's in
distribution and in pixels, and the training set on the device in a run (on the CPU: it is plain tensor code)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

import noisymlt.training.device_images as dimg
from helpers import tiny_params, toy_trainer
from noisymlt.config import resolve_run
from noisymlt.errors import NoisyMLTError
from noisymlt.training.augment import (
    BRIGHT, CONTRAST_AFTER, CONTRAST_BEFORE, FLIP, HSV, HUE, P0, SAT, X0, X1, Y0, Y1, augment, draw_train_params,
    photometric)

N = 20000
SIDE = 256


def loader_params(n: int = N, side: int = SIDE) -> np.ndarray:
    """The cache loader's draws: one numpy generator per slot, as CachedTrainImages seeds them."""
    return np.stack([draw_train_params(np.random.default_rng(1000 + i), side, side) for i in range(n)])


def device_params(n: int = N, side: int = SIDE, seed: int = 7) -> np.ndarray:
    return dimg.draw_params(n, side, torch.Generator().manual_seed(seed)).numpy()


def features(p: np.ndarray, side: int = SIDE) -> dict[str, np.ndarray]:
    cw, ch = p[:, X1] - p[:, X0], p[:, Y1] - p[:, Y0]
    drawn = lambda k, neutral: p[p[:, k] != neutral, k]  # noqa: E731  the values where an op was drawn
    return {"area": cw * ch / side**2, "aspect": cw / ch, "x0_free": p[:, X0] / np.maximum(side - cw, 1),
            "brightness": drawn(BRIGHT, 0.0), "contrast_before": drawn(CONTRAST_BEFORE, 1.0),
            "contrast_after": drawn(CONTRAST_AFTER, 1.0), "saturation": drawn(SAT, 1.0), "hue": drawn(HUE, 0.0)}


def rates(p: np.ndarray) -> dict[str, float]:
    return {"flip": p[:, FLIP].mean(), "brightness": (p[:, BRIGHT] != 0).mean(), "hsv": p[:, HSV].mean(),
            "contrast": ((p[:, CONTRAST_BEFORE] != 1) | (p[:, CONTRAST_AFTER] != 1)).mean(),
            "before": (p[:, CONTRAST_BEFORE] != 1).mean(), "swap": (p[:, P0] != 0).mean()
            + ((p[:, P0] == 0) & (p[:, P0 + 1] != 1)).mean()}


@pytest.fixture(scope="module")
def both():
    return loader_params(), device_params()


def test_device_draws_match_the_loaders_distributions(both):
    ref, dev = both
    fr, fd = features(ref), features(dev)
    for name in fr:  # two-sample KS: the same distribution, each continuous or integer-valued quantity
        result = stats.ks_2samp(fr[name], fd[name])
        assert result.pvalue > 1e-3, (name, result)
    # the ranges themselves: crop 0.8..1 of each side, brightness +-32, factors 0.5..1.5, hue +-18
    assert fd["area"].min() >= 0.8**2 - 0.01 and fd["area"].max() == 1.0
    assert 0.8 - 0.01 <= fd["aspect"].min() < 0.82 and 1.22 < fd["aspect"].max() <= 1.25 + 0.01
    assert -32 <= fd["brightness"].min() < -31 and 31 < fd["brightness"].max() <= 32
    for k in ("contrast_before", "contrast_after", "saturation"):
        assert 0.5 <= fd[k].min() < 0.52 and 1.48 < fd[k].max() <= 1.5, k
    assert -18 <= fd["hue"].min() < -17.5 and 17.5 < fd["hue"].max() <= 18
    rr, rd = rates(ref), rates(dev)
    se = 4 * np.sqrt(0.25 / N)  # 4 standard errors of a rate near 0.5
    for name in rr:
        assert abs(rr[name] - rd[name]) < se * 2, (name, rr[name], rd[name])
    assert abs(rd["flip"] - 0.5) < se and abs(rd["brightness"] - 0.5) < se and abs(rd["hsv"] - 0.75) < se
    assert abs(rd["contrast"] - 0.5) < se and abs(rd["before"] - 0.25) < se
    perms = Counter(map(tuple, dev[:, P0:P0 + 3].astype(int)))
    # identity: half the views plus a sixth of the swapped half; each other order a twelfth
    assert set(perms) == {(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)}
    assert abs(perms[(0, 1, 2)] / N - 7 / 12) < se
    assert all(abs(c / N - 1 / 12) < se for k, c in perms.items() if k != (0, 1, 2))


def test_the_comparison_would_fail_for_a_wrong_range(both, monkeypatch):
    ref, _ = both
    monkeypatch.setattr(dimg, "CROP_LO", 0.7)  # crops of 0.7..1 of each side instead of 0.8..1
    wrong = features(device_params())
    assert stats.ks_2samp(features(ref)["area"], wrong["area"]).pvalue < 1e-6
    p = device_params()
    p[:, HUE] *= 1.5  # hue +-27 instead of +-18
    assert stats.ks_2samp(features(ref)["hue"], features(p)["hue"]).pvalue < 1e-6


def test_same_draws_give_the_loaders_pixels(tiny_toy):
    """Given the loader's parameter rows, the device ops give its images: crop geometry and mirroring exact to
    the resampling (no antialias here), photometric ops to float rounding."""
    rows = torch.from_numpy(np.load(tiny_toy["train_cache"])[:64]).permute(0, 3, 1, 2).contiguous()
    side = rows.shape[-1]
    params = torch.from_numpy(loader_params(64, side))
    ref = augment(rows, params, 32, photometric_on=True)
    dev = dimg.augment_on_device(rows, params, 32, photometric=True)
    assert dev.shape == ref.shape == (64, 3, 32, 32)
    diff = (dev - ref).abs()
    # measured 0.0083 (half a grey level; at most 0.18 where the loader antialiases a 40 -> 32 px downscale)
    assert diff.mean() < 0.03, diff.mean()  # normalised units (1 = one std of ImageNet, about 57 grey levels)
    unflipped = params.clone()
    unflipped[:, FLIP] = 1 - unflipped[:, FLIP]  # a mirror on the wrong views is far off
    assert (dimg.augment_on_device(rows, unflipped, 32) - ref).abs().mean() > 10 * diff.mean()
    x = torch.rand(64, 3, 32, 32) * 255
    assert torch.allclose(dimg.photometric_dense(x, params), photometric(x, params), atol=1e-3)


def _run(tiny_toy, out, **train):
    resolved = resolve_run(tiny_params("erm", trunk_cache_views=0, **train), "toy", "erm", 0.5, 0)
    return toy_trainer(tiny_toy, resolved, out)


def test_a_run_trains_on_the_device_set_and_repeats_exactly(tiny_toy, tmp_path):
    runs = []
    for name in ("a", "b"):
        t = _run(tiny_toy, tmp_path / name, device_images=True)
        t.run()
        runs.append(np.load(tmp_path / name / "predictions.npz")["scores_main"])
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert manifest["device_images"].startswith("on (")
        assert np.isfinite(manifest["history"][-1]["loss"])
    assert np.array_equal(runs[0], runs[1])  # a batch is a function of (seed, epoch, slot)
    _run(tiny_toy, tmp_path / "c").run()  # auto on the CPU: the loader, as before
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["device_images"] == "off (auto: the CPU keeps its loader)"
    assert not np.array_equal(runs[0], np.load(tmp_path / "c" / "predictions.npz")["scores_main"])  # another draw


def test_device_images_true_needs_the_cache_loader(tiny_toy, tmp_path):
    t = _run(tiny_toy, tmp_path / "run", device_images=True, loader="pil")
    with pytest.raises(NoisyMLTError, match="train.device_images is true but train.loader is not cache"):
        t.fit()


def test_auto_goes_on_the_card_when_the_set_fits_its_stated_share(monkeypatch):
    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    cuda = torch.device("cuda", 0)
    tcfg = {"device_images": "auto", "device_images_max_share": 0.1}
    use, why = dimg.device_images_choice(tcfg, cuda, 400 * 2**20, 0, True)  # COCO-MLT at 256 px
    assert use and why == "on (400 MiB of 80 GiB, auto)"
    use, why = dimg.device_images_choice(tcfg, cuda, 9 * 2**30, 0, True)
    assert not use and "exceeds train.device_images_max_share 0.1" in why
    assert not dimg.device_images_choice(tcfg, cuda, 2**20, 8, True)[0]  # fixed trunk views come first
    assert not dimg.device_images_choice(tcfg, torch.device("cpu"), 2**20, 0, True)[0]
