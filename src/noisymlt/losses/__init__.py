"""Multi-label losses of the paper and its baselines (SPEC sections 3 and 4), one module per loss.

This package is the registry: a loss name maps to the module that implements it, imported when a loss
is built. A module of this package registers its losses with a ``FACTORIES`` dict at its top level (name ->
(factory, loss class, needs class counts)); the registry reads those names from the source, so adding a loss is
adding its module, and importing the registry imports no torch. A run depends on the code of the losses it uses
and on no other (noisymlt.core.codedeps follows imports, not names). The paper's loss classes stay
importable from here (``from noisymlt.losses import DistributionBalancedLoss``).
"""

from __future__ import annotations

import ast
import importlib
import inspect

from noisymlt.errors import NoisyMLTError
from noisymlt.core.registry import registered


def _factory_names(tree: ast.Module) -> list[str]:
    """The string keys of a loss module's top-level ``FACTORIES = {...}``."""
    names = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "FACTORIES" for t in node.targets)):
            for key in node.value.keys:
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    raise NoisyMLTError("a FACTORIES key is not a loss name written as a string")
                names.append(key.value)
    return names


# loss name -> module whose FACTORIES entry builds it
LOSSES = registered(__file__, __name__, _factory_names, "loss", marker="FACTORIES")
_CLASSES = {"BCELoss": "bce", "FocalLoss": "focal", "DistributionBalancedLoss": "db", "LDAMLoss": "ldam",
            "MultiLabelLoss": "base"}
_FIXED = {"class_counts", "num_images", "focal"}  # set by build_loss / the name, never by params


def build_loss(
    name: str,
    class_counts: object = None,
    num_images: int | None = None,
    **params: float,
):
    """The loss called ``name`` (one of LOSSES), built from the training class counts and size.

    ``params`` are the keyword parameters of the loss class (e.g. ``neg_scale``, ``map_mu`` for
    db/db_focal; ``gamma``, ``alpha`` for focal); unknown, missing or out-of-range ones are refused.
    """
    if name not in LOSSES:
        raise NoisyMLTError(f"unknown loss '{name}'; known losses: {', '.join(sorted(LOSSES))}")
    factory, cls, needs_counts = importlib.import_module(LOSSES[name]).FACTORIES[name]
    sig = inspect.signature(cls.__init__).parameters
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    allowed = {k for k, p in sig.items() if p.kind in keyword and k != "self"} - _FIXED
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise NoisyMLTError(
            f"loss '{name}': unknown parameter(s) {unknown}; accepted: {sorted(allowed) or 'none'}"
        )
    missing = sorted(k for k in allowed if sig[k].default is inspect.Parameter.empty and k not in params)
    if missing:
        raise NoisyMLTError(f"loss '{name}': missing required parameter(s) {missing}")
    if needs_counts and class_counts is None:
        raise NoisyMLTError(f"loss '{name}' needs the class counts of the training labels")
    if "num_images" in sig and num_images is None:
        raise NoisyMLTError(f"loss '{name}' needs the number of training images")
    return factory(class_counts, num_images, **params)


def __getattr__(name: str):
    if name in _CLASSES:
        return getattr(importlib.import_module(f"noisymlt.losses.{_CLASSES[name]}"), name)
    raise AttributeError(f"module 'noisymlt.losses' has no attribute {name!r}")
