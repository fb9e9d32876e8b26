"""Method registry, light: family name -> the module that implements it, imported on demand.

Importing this package imports no torch: params validation and the data steps only need the family
names and their option checks (noisymlt.methods.options). A module of this package that defines a family
registers its class with ``@register_family("name")``; the registry reads those names from the source, so a
new family is one module. ``load_family`` imports one family's module when a run is built; ``run_entries``
names the code a run's result depends on. ``FAMILIES``,
``Method``, ``TrainContext``, ``register_family`` and ``eval_mode`` are still importable from here; asking for
them imports the training code.
"""

from __future__ import annotations

import importlib

from noisymlt.core.registry import decorated_classes, import_registered

FAMILY_MODULES = decorated_classes(__file__, __name__, "register_family", "method family")
_BASE_NAMES = ("FAMILIES", "Method", "TrainContext", "register_family", "eval_mode")


def load_family(name: str):
    """The Method class of family ``name`` (its module imported now)."""
    import_registered(FAMILY_MODULES, name, "method family")
    # by name, like the families: the package stays light for whoever imports it for its names
    return importlib.import_module("noisymlt.methods.base").FAMILIES[name]


def run_entries(resolved: dict) -> tuple[str, ...]:
    """The code of a training run's result: the trainer, its method's family module and the modules of the
    losses it trains with (both loaded by name at run time, hence not in the trainer's own closure). Not the
    `train` command around it, which only reads the resolved configuration (whose hash is the run id) and names
    the input files (whose hashes the checkpoint and manifest hold)."""
    from noisymlt.core.codedeps import TRAINER
    from noisymlt.losses import LOSSES
    from noisymlt.methods.options import losses_used, method_options

    family = resolved["method_cfg"]["family"]
    losses = losses_used(family, method_options(resolved["method_cfg"]))
    return (TRAINER, FAMILY_MODULES[family], *sorted({LOSSES[name] for name in losses}))


def run_digest(resolved: dict) -> str:
    """The digest of ``run_entries``' import closure: what Snakemake passes a training job as its code param."""
    from noisymlt.core.codedeps import digest

    return digest(*run_entries(resolved))


def __getattr__(name: str):
    if name in _BASE_NAMES:
        base = importlib.import_module("noisymlt.methods.base")
        if name == "FAMILIES":  # the complete registry: every family's module
            for family in FAMILY_MODULES:
                load_family(family)
        return getattr(base, name)
    raise AttributeError(f"module 'noisymlt.methods' has no attribute {name!r}")


__all__ = ["FAMILY_MODULES", "load_family", "run_digest", "run_entries", *_BASE_NAMES]
