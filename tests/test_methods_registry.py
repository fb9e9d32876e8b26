"""Every method and ablation variant in params.yaml trains a few iterations on the embedded dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.config import resolve_run

ALL_METHODS = sorted(tiny_params()["methods"])


def test_every_grid_method_is_defined():
    params = tiny_params()
    from noisymlt.config import load_params
    from pathlib import Path

    paper = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    assert set(paper["grid"]["methods"]) <= set(params["methods"])


@pytest.mark.parametrize("method", ALL_METHODS)
def test_method_trains_and_predicts(method, tiny_toy, tmp_path):
    params = tiny_params(method, epochs=2, lr_steps=[2])
    resolved = resolve_run(params, "toy", method, 0.5, 0)
    labels = tiny_toy["noisy"]
    if resolved.get("clean"):  # clean, then retrain: its noisy set cleaned (the oracle's cleaning: no cross-fitting)
        from noisymlt.pipeline.cleaning import clean_labels

        labels = tmp_path / "cleaned" / "labels.parquet"
        clean_labels(tiny_toy["noisy"], labels, flags="oracle", action=resolved["clean"]["action"],
                     clean_labels=tiny_toy["train"])
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run", limit_iters=3, train_labels=labels)
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


def test_registries_read_names_from_the_source_and_refuse_a_name_twice(tmp_path):
    import ast

    from noisymlt.errors import NoisyMLTError
    from noisymlt.losses import LOSSES
    from noisymlt.methods import FAMILIES, FAMILY_MODULES
    from noisymlt.core.registry import registered

    # the registries name exactly what the imported modules register
    assert {name: cls.__module__ for name, cls in FAMILIES.items()} == FAMILY_MODULES
    assert set(LOSSES.values()) == {f"noisymlt.losses.{m}" for m in ("bce", "db", "focal", "ldam")}

    def constants(tree: ast.Module) -> list[str]:
        return [n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]

    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("X = 'one'\nY = 'two'\n")
    (tmp_path / "_private.py").write_text("X = 'one'\n")  # not a registering module
    assert registered(str(tmp_path / "__init__.py"), "pkg", constants, "thing", marker="=") == {"one": "pkg.a", "two": "pkg.a"}
    (tmp_path / "b.py").write_text("Z = 'two'\n")
    with pytest.raises(NoisyMLTError, match="thing 'two' is registered by pkg.a and pkg.b"):
        registered(str(tmp_path / "__init__.py"), "pkg", constants, "thing", marker="=")


def test_a_new_family_module_states_its_options_in_its_own_source(tmp_path, monkeypatch):
    """A family added since (not in options.SCHEMAS) is checked against its module's OPTIONS_SCHEMA literal,
    without importing the module, and its runs depend on every loss module."""
    import importlib.util

    from noisymlt.methods import options
    from noisymlt.core.schema import ParamsError

    module = tmp_path / "probe_family.py"
    module.write_text("import torch  # never imported by the check\n"
                      "OPTIONS_SCHEMA = {'type': 'object', 'additionalProperties': False,\n"
                      "                  'properties': {'decay': {'type': 'number', 'exclusiveMaximum': 1}}}\n")
    monkeypatch.setitem(__import__("noisymlt.methods", fromlist=["x"]).FAMILY_MODULES, "probe", "probe_family")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: type("Spec", (), {"origin": str(module)}))
    options.check_options("probe", {"decay": 0.5}, "methods.p")
    with pytest.raises(ParamsError, match="methods.p.decay"):
        options.check_options("probe", {"decay": 2}, "methods.p")
    with pytest.raises(ParamsError, match="unknown family 'nope'"):
        options.check_options("nope", {}, "methods.p")
    assert options.losses_used("probe", {}) == sorted(__import__("noisymlt.losses", fromlist=["x"]).LOSSES)
