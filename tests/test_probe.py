"""The linear probe of a frozen trunk (noisymlt.training.probe): the ridge solution against its normal equations
solved another way, the strength chosen from the training images alone, and pooled features against a plain mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.metrics import average_precisions
from noisymlt.training.probe import _ridge, pooled_features, ridge_probe


def test_the_ridge_solution_is_the_penalised_least_squares_one():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 6)), (rng.random((50, 3)) < 0.4).astype(float)
    w, b = _ridge(x, y, 0.3)
    # augmented least squares: [x 1; sqrt(0.3 N) I 0] [w; b] ~ [y; 0] (the bias unpenalised)
    n = x.shape[0]
    a = np.block([[x, np.ones((n, 1))], [np.sqrt(0.3 * n) * np.eye(6), np.zeros((6, 1))]])
    target = np.vstack([y, np.zeros((6, 3))])
    solution = np.linalg.lstsq(a, target, rcond=None)[0]
    assert np.allclose(w, solution[:6]) and np.allclose(b, solution[6])


def test_a_planted_linear_structure_is_found_and_noise_is_not():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 10))
    y = (x[:, :4] + 0.3 * rng.normal(size=(300, 4)) > 0.8).astype(float)
    test_x = rng.normal(size=(200, 10))
    test_y = (test_x[:, :4] > 0.8).astype(float)
    found = ridge_probe(x, y, test_x)
    assert np.nanmean(average_precisions(test_y, found["test_scores"])) > 0.9
    shuffled = ridge_probe(x, rng.permutation(y), test_x)
    assert np.nanmean(average_precisions(test_y, shuffled["test_scores"])) < 0.6
    assert set(found["cv_map"]) == {f"{s:g}" for s in (1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100, 1000)}


def test_the_strength_is_chosen_without_the_test_images():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(120, 8)), (rng.random((120, 3)) < 0.3).astype(float)
    a = ridge_probe(x, y, rng.normal(size=(40, 8)))
    b = ridge_probe(x, y, 100 * rng.normal(size=(70, 8)))
    assert a["strength"] == b["strength"] and a["cv_map"] == b["cv_map"]
    with pytest.raises(NoisyMLTError, match="feature rows"):
        ridge_probe(x[:3], y[:3], x)


def test_pooled_features_are_the_mean_over_positions_in_eval_mode():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.BatchNorm2d(5), torch.nn.Dropout(0.9))
    batches = [torch.randn(4, 3, 8, 8), torch.randn(2, 3, 8, 8)]
    got = pooled_features(net, iter(batches))
    net.eval()
    with torch.no_grad():
        want = torch.cat([net(b).mean(dim=(2, 3)) for b in batches]).numpy()
    assert got.shape == (6, 5) and np.allclose(got, want, atol=1e-6)


def test_the_experiments_readme_shows_its_frozen_result():
    """experiments/probe_vs_finetune/README.md's table is the rendering of its result.json."""
    import importlib.util
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "experiments" / "probe_vs_finetune"
    spec = importlib.util.spec_from_file_location("summarize", folder / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = json.loads((folder / "result.json").read_text())
    assert module.table(result) in (folder / "README.md").read_text()
    demo = result["demo_recipe"]["runs"]
    assert all(demo[s]["probe_map"] - next(iter(demo[s]["finetuned_map"].values())) > 5 for s in demo)


def test_the_probe_record_is_the_ridge_probes_test_map_and_the_feature_spectrum():
    from noisymlt.training.probe import probe_record

    torch.manual_seed(1)
    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.ReLU())
    rng = np.random.default_rng(4)
    train_images, test_images = torch.randn(40, 3, 8, 8), torch.randn(30, 3, 8, 8)
    train_y, test_y = (rng.random((40, 3)) < 0.4).astype(float), (rng.random((30, 3)) < 0.4).astype(float)
    got = probe_record(trunk, iter([train_images[:25], train_images[25:]]), iter([test_images]), train_y, test_y, seed=2)
    with torch.no_grad():
        train_x = trunk(train_images).mean(dim=(2, 3)).double().numpy()
        test_x = trunk(test_images).mean(dim=(2, 3)).double().numpy()
    want = ridge_probe(train_x, train_y, test_x, seed=2)
    assert got["probe_map"] == pytest.approx(np.nanmean(average_precisions(test_y, want["test_scores"])), abs=1e-6)
    assert got["probe_strength"] == want["strength"]
    eig = np.linalg.eigvalsh(np.cov(train_x, rowvar=False))
    assert got["probe_participation_ratio"] == pytest.approx(eig.sum() ** 2 / (eig ** 2).sum(), abs=1e-3)
    assert 1 <= got["probe_participation_ratio"] <= 6


def test_a_clean_run_records_the_probe_of_its_pretrained_trunk_and_a_noisy_run_does_not(tiny_toy, tmp_path):
    """gamma 0 (the clean column): the fit record holds the probe of the run's frozen trunk as the run's weights
    give it before training (built afresh: the same after a resume), scored on the test set; aggregate carries it
    as fit_probe_map and the fit table sets it beside the run's own mAP."""
    import json

    from helpers import tiny_params, toy_trainer

    from noisymlt.config import resolve_run
    from noisymlt.report.aggregate import fit_rows

    params = tiny_params("erm", epochs=1, lr_steps=[1], warmup_iters=1)
    clean = resolve_run(params, "toy", "erm", 0.0, 0)
    trainer = toy_trainer(tiny_toy, clean, tmp_path / "clean", train_labels=tiny_toy["train"], limit_iters=2)
    trainer.run()
    fit = json.loads((tmp_path / "clean" / "manifest.json").read_text())["fit"]
    assert set(fit["probe"]) == {"probe_map", "probe_strength", "probe_participation_ratio"}
    assert 0 < fit["probe"]["probe_map"] < 1
    assert fit["probe"] == trainer.probe()  # the trunk from the run's weights, not the fine-tuned one
    rows = fit_rows(fit, {"run_id": "r"})
    assert [r["value"] for r in rows if r["metric"] == "fit_probe_map"] == [fit["probe"]["probe_map"]]
    noisy = resolve_run(params, "toy", "erm", 0.5, 0)
    trainer = toy_trainer(tiny_toy, noisy, tmp_path / "noisy", limit_iters=2)
    trainer.run()
    assert "probe" not in json.loads((tmp_path / "noisy" / "manifest.json").read_text())["fit"]
