"""Label-noise models, registered like dataset kinds: model name -> the module that defines it.

A model says how each clean positive label of a training image fares: kept, replaced by another class, or dropped
(``NoiseModel.draw``). ``noisymlt noise`` (noisymlt.data.noise) applies it and measures what happened. A module of
this package registers its class with ``@register_noise_model("name")``; the registry reads the names from the
source (``noisymlt.core.registry``), so a new model is one module (docs/noise-models.md). ``PAPER`` is the paper's
co-occurrence model, the default: its files, paths and run ids carry no model name.
"""

from __future__ import annotations

import ast
import importlib

from noisymlt.core.registry import registered
from noisymlt.data.noise_models.base import DROP, KEEP, PAPER, NoiseModel, register_noise_model
from noisymlt.errors import NoisyMLTError


def _model_names(tree: ast.Module) -> list[str]:
    """The names in a module's ``@register_noise_model("name")`` class decorators."""
    return [deco.args[0].value for node in tree.body if isinstance(node, ast.ClassDef) for deco in node.decorator_list
            if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register_noise_model"
            and deco.args and isinstance(deco.args[0], ast.Constant)]


NOISE_MODULES = registered(__file__, __name__, _model_names, "noise model", marker="@register_noise_model(")


def noise_model(name: str) -> NoiseModel:
    """The model ``name`` (its module imported now)."""
    if name not in NOISE_MODULES:
        raise NoisyMLTError(f"unknown noise model {name!r}; known: {', '.join(sorted(NOISE_MODULES))}")
    importlib.import_module(NOISE_MODULES[name])
    return register_noise_model.MODELS[name]


def all_noise_models() -> dict[str, NoiseModel]:
    return {name: noise_model(name) for name in sorted(NOISE_MODULES)}


__all__ = ["DROP", "KEEP", "NOISE_MODULES", "NoiseModel", "PAPER", "all_noise_models", "noise_model",
           "register_noise_model"]
