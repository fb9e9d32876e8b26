"""Label-noise models, registered like dataset kinds: model name -> the module that defines it.

A model says how each clean positive label of a training image fares: kept, replaced by another class, or dropped
(``NoiseModel.draw``). ``noisymlt noise`` (noisymlt.data.noise) applies it and measures what happened. A module of
this package registers its class with ``@register_noise_model("name")``; the registry reads the names from the
source (``noisymlt.core.registry``), so a new model is one module (docs/noise-models.md). ``PAPER`` is the paper's
co-occurrence model, the default: its files, paths and run ids carry no model name.
"""

from __future__ import annotations

from noisymlt.core.registry import decorated_classes, import_registered
from noisymlt.data.noise_models.base import DROP, KEEP, PAPER, NoiseModel, register_noise_model

NOISE_MODULES = decorated_classes(__file__, __name__, "register_noise_model", "noise model")


def noise_model(name: str) -> NoiseModel:
    """The model ``name`` (its module imported now)."""
    import_registered(NOISE_MODULES, name, "noise model")
    return register_noise_model.MODELS[name]


def all_noise_models() -> dict[str, NoiseModel]:
    return {name: noise_model(name) for name in sorted(NOISE_MODULES)}


__all__ = ["DROP", "KEEP", "NOISE_MODULES", "NoiseModel", "PAPER", "all_noise_models", "noise_model",
           "register_noise_model"]
