"""Dataset kinds, registered like method families: kind name -> the module that describes it.

A kind says how a dataset's raw data arrive, how they become the label table, what its long-tail subset is and
which per-kind facts the methods and the planners read (class names, published subsets, [CL]'s thresholds, GloVe
rows). A module of this package registers its class with ``@register_kind("name")``; the registry reads the
names from the source (``noisymlt.core.registry``), so a new kind is one module and a params block
(docs/datasets.md, "Add your own data"). Nothing outside these modules compares a kind's name.
"""

from __future__ import annotations

import ast
import importlib

from noisymlt.core.registry import registered
from noisymlt.data.kinds.base import DatasetKind, register_kind
from noisymlt.errors import NoisyMLTError


def _kind_names(tree: ast.Module) -> list[str]:
    """The names in a module's ``@register_kind("name")`` class decorators."""
    return [deco.args[0].value for node in tree.body if isinstance(node, ast.ClassDef) for deco in node.decorator_list
            if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register_kind"
            and deco.args and isinstance(deco.args[0], ast.Constant)]


KIND_MODULES = registered(__file__, __name__, _kind_names, "dataset kind", marker="@register_kind(")


def kind_of(name: str) -> DatasetKind:
    """The kind ``name`` (its module imported now)."""
    if name not in KIND_MODULES:
        raise NoisyMLTError(f"unknown dataset kind {name!r}; known: {', '.join(sorted(KIND_MODULES))}")
    importlib.import_module(KIND_MODULES[name])
    return register_kind.KINDS[name]


def dataset_kind(block: dict) -> DatasetKind:
    """The kind of a ``datasets.NAME`` block (or of a resolved run's config, which carries ``kind``)."""
    return kind_of(block["kind"])


def all_kinds() -> dict[str, DatasetKind]:
    return {name: kind_of(name) for name in sorted(KIND_MODULES)}


__all__ = ["DatasetKind", "KIND_MODULES", "all_kinds", "dataset_kind", "kind_of", "register_kind"]
