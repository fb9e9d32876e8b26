"""Registries read from the source: a module of a package names what it provides in its own code, and the
package's registry finds those names without importing anything (so it stays torch-free for params checks).
Adding a loss or a method family is then adding its module."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

from noisymlt.errors import NoisyMLTError


def registered(package_init: str, package: str, names: Callable[[ast.Module], Iterable[str]],
               what: str) -> dict[str, str]:
    """Name -> module for every module of ``package`` (beside ``package_init``, its ``__init__.py``) and every
    name that ``names`` finds in that module's syntax tree; a name found twice is refused."""
    found: dict[str, str] = {}
    for path in sorted(Path(package_init).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = f"{package}.{path.stem}"
        for name in names(ast.parse(path.read_text(), filename=str(path))):
            if name in found:
                raise NoisyMLTError(f"{what} {name!r} is registered by {found[name]} and {module}")
            found[name] = module
    return found
