"""Dataset kinds, registered like method families: kind name -> the module that describes it.

A kind says how a dataset's raw data arrive, how they become the label table, what its long-tail subset is and
which per-kind facts the methods and the planners read (class names, published subsets, [CL]'s thresholds, GloVe
rows). A module of this package registers its class with ``@register_kind("name")``; the registry reads the
names from the source (``noisymlt.core.registry``), so a new kind is one module and a params block
(docs/datasets.md, "Add your own data"). Nothing outside these modules compares a kind's name.
"""

from __future__ import annotations

from noisymlt.core.registry import decorated_classes, import_registered
from noisymlt.data.kinds.base import DatasetKind, register_kind

KIND_MODULES = decorated_classes(__file__, __name__, "register_kind", "dataset kind")


def kind_of(name: str) -> DatasetKind:
    """The kind ``name`` (its module imported now)."""
    import_registered(KIND_MODULES, name, "dataset kind")
    return register_kind.KINDS[name]


def dataset_kind(block: dict) -> DatasetKind:
    """The kind of a ``datasets.NAME`` block (or of a resolved run's config, which carries ``kind``)."""
    return kind_of(block["kind"])


def all_kinds() -> dict[str, DatasetKind]:
    return {name: kind_of(name) for name in sorted(KIND_MODULES)}


__all__ = ["DatasetKind", "KIND_MODULES", "all_kinds", "dataset_kind", "kind_of", "register_kind"]
