"""Every method and ablation variant in params.yaml trains a few iterations on the embedded dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_params, toy_trainer
from noisymlt.pipeline.config import resolve_run

ALL_METHODS = sorted(tiny_params()["methods"])


def test_every_grid_method_is_defined():
    params = tiny_params()
    from noisymlt.pipeline.config import load_params
    from pathlib import Path

    paper = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    assert set(paper["grid"]["methods"]) <= set(params["methods"])


@pytest.mark.parametrize("method", ALL_METHODS)
def test_method_trains_and_predicts(method, tiny_toy, tmp_path):
    params = tiny_params(method, epochs=2, lr_steps=[2])
    resolved = resolve_run(params, "toy", method, 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path, limit_iters=3)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if v.is_floating_point()}
    history = trainer.fit()
    assert len(history) == 2 and all(np.isfinite(r["loss"]) for r in history)
    after = trainer.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no weight changed"
    scores = trainer.predict()
    assert list(scores) == list(trainer.method.heads)
    for head, s in scores.items():
        assert s.shape == (200, 20), head
        assert np.isfinite(s).all() and (s >= 0).all() and (s <= 1).all(), head
